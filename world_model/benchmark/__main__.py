"""`python -m world_model.benchmark`: the paper's Table 5 benchmark (`world_model.benchmark.table5`)."""

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
from world_model.benchmark.table5 import main

if __name__ == "__main__":
    raise SystemExit(main())
