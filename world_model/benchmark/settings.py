"""The settings of a benchmark command (`python -m world_model.benchmark`): one dataclass whose fields are the
command's flags (`world_model.utils.flags.SettingsParser`) and the argument of `table5.run_benchmark`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from world_model.benchmark.preset import BenchmarkError
from world_model.models.precision import PRECISIONS


@dataclass
class BenchmarkSettings:
    """What a benchmark command runs: the preset, the data and output folders, and the overrides of the preset.
    `pairs`, `seeds` and `rows` are comma-separated lists as the flags take them (None: the preset's)."""

    preset: str = field(
        metadata={"help": "cpu, attention, paper (configs/benchmark/<name>.yaml) or the path of a preset YAML file"}
    )
    data: Path = field(metadata={"help": "folder with ROCStories*.csv and cloze_test_*.csv"})
    out: Path = field(metadata={"help": "output folder (must not hold a benchmark unless --resume)"})
    precision: str | None = field(
        default=None,
        metadata={
            "choices": PRECISIONS,
            "help": "fp32 or bf16 for every run (default: the preset's training.precision)",
        },
    )
    max_epochs: int | None = field(default=None, metadata={"help": "override the preset's epoch cap (every run)"})
    max_minutes: float | None = field(
        default=None, metadata={"help": "time budget of the whole command, split equally across the runs it trains"}
    )
    train_subset: int | None = field(
        default=None, metadata={"help": "train on the first K training stories (every run)"}
    )
    pairs: str | None = field(
        default=None,
        metadata={"help": "comma-separated pair names of the preset (default: all, e.g. h2_l2,h4_l2,h4_l3)"},
    )
    seeds: str | None = field(
        default=None, metadata={"help": "comma-separated seeds (default: the preset's seeds, or its training seed)"}
    )
    rows: str | None = field(
        default=None,
        metadata={
            "help": "comma-separated rows to run: four_tensor, baseline and the preset's variant names (default: "
            "all); lets several processes share one benchmark"
        },
    )
    resume: bool = field(default=False, metadata={"help": "skip finished runs and resume interrupted ones"})
    report_only: bool = field(
        default=False,
        metadata={
            "help": "train nothing: write the reports from the runs in --out that have finished (a benchmark run in "
            "pieces)"
        },
    )
    progress: bool = field(default=True, metadata={"help": "progress bars (--no-progress: none)"})

    def pair_list(self) -> list[str] | None:
        return comma_list(self.pairs)

    def row_list(self) -> list[str] | None:
        return comma_list(self.rows)

    def seed_list(self) -> list[int] | None:
        try:
            return [int(x) for x in self.seeds.split(",") if x.strip()] if self.seeds is not None else None
        except ValueError:
            raise BenchmarkError(f"--seeds must be comma-separated integers, got {self.seeds!r}") from None


def comma_list(text: str | None) -> list[str] | None:
    """The items of a comma-separated flag value (None: the flag was not given)."""
    return None if text is None else text.split(",")
