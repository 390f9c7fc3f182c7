"""`python -m apps.demo`: serve the demo (`apps.demo.app.main`)."""

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
from apps.demo.app import main

if __name__ == "__main__":
    raise SystemExit(main())
