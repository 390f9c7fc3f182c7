"""Command-line flags generated from a settings dataclass (world_model.training.config), as the pack trainers use them."""

import argparse
from dataclasses import dataclass

import pytest

from world_model.training.config import add_dataclass_flags, dataclass_from_args


@dataclass
class Settings:
    batch_size: int = 16
    lr: float = 1e-3
    bf16: bool = True
    max_steps: int | None = None
    channels: tuple[int, ...] = (32, 64)
    kind: str = "sample"
    size: tuple[int, int] = (48, 144)


def parse(argv):
    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, Settings, skip=("size",))
    return dataclass_from_args(Settings, parser.parse_args(argv), skip=("size",))


def test_defaults_come_back_unchanged():
    assert parse([]) == Settings()


def test_each_kind_of_field_parses_to_its_type():
    got = parse(
        [
            "--batch-size",
            "4",
            "--lr",
            "3e-4",
            "--no-bf16",
            "--max-steps",
            "7",
            "--channels",
            "8",
            "16",
            "24",
            "--kind",
            "v_prediction",
        ]
    )
    assert got == Settings(4, 3e-4, False, 7, (8, 16, 24), "v_prediction")
    assert isinstance(got.channels, tuple) and isinstance(got.lr, float)


def test_skipped_fields_get_no_flag_and_bad_values_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse(["--size", "1", "2"])
    with pytest.raises(SystemExit):
        parse(["--batch-size", "four"])
    assert "invalid int value" in capsys.readouterr().err
