"""Command-line flags generated from settings dataclasses (world_model.utils.cli.SettingsParser), as every command
builds its parser."""

from dataclasses import dataclass, field

import pytest

from world_model.utils.cli import SettingsParser


@dataclass
class Settings:
    batch_size: int = 16
    lr: float = 1e-3
    bf16: bool = True
    max_steps: int | None = None
    channels: tuple[int, ...] = (32, 64)
    kind: str = "sample"
    size: tuple[int, int] = field(default=(48, 144), metadata={"flag": False})
    resume: bool = False


def parse(argv):
    (settings,) = SettingsParser(Settings, prog="prog", description="").parse(argv)
    return settings


def test_defaults_come_back_unchanged():
    assert parse([]) == Settings()


def test_each_kind_of_field_parses_to_its_type():
    argv = "--batch-size 4 --lr 3e-4 --no-bf16 --max-steps 7 --channels 8 16 24 --kind v_prediction --resume"
    got = parse(argv.split())
    assert got == Settings(4, 3e-4, False, 7, (8, 16, 24), "v_prediction", (48, 144), True)
    assert isinstance(got.channels, tuple) and isinstance(got.lr, float)


def test_underscore_spellings_and_no_form_of_an_off_setting_are_accepted():
    assert parse(["--batch_size", "4", "--no-resume"]) == Settings(batch_size=4)


def test_skipped_fields_get_no_flag_and_bad_values_exit_2_with_the_usage(capsys):
    for argv in (["--size", "1", "2"], ["--batch-size", "four"], ["--unknown"]):
        with pytest.raises(SystemExit) as stop:
            parse(argv)
        assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "invalid int value" in err and "unrecognized arguments: --size 1 2" in err
    assert err.count("usage: prog") == 3


def test_the_help_names_the_dashed_flag_first(capsys):
    with pytest.raises(SystemExit):
        parse(["--help"])
    out = capsys.readouterr().out
    assert "--batch-size BATCH_SIZE, --batch_size BATCH_SIZE" in out and "--size" not in out
