"""`python -m apps.demo`: serve the demo (`apps.demo.app.main`)."""

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import os
import sys

from apps.demo.app import main

if __name__ == "__main__":
    code = main()
    if code >= 128:  # stopped by a signal: a request's worker thread may still be inside torch, whose C++ threads
        sys.stdout.flush()  # abort the process (SIGABRT) if the interpreter is torn down around them; the request
        sys.stderr.flush()  # folders are already removed, so end here with the signal's exit code
        os._exit(code)
    raise SystemExit(code)
