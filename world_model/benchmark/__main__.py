"""`python -m world_model.benchmark`: the paper's Table 5 benchmark (`world_model.benchmark.table5`)."""

from world_model.benchmark.table5 import main

if __name__ == "__main__":
    raise SystemExit(main())
