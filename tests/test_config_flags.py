"""Command-line flags generated from settings dataclasses (world_model.utils.flags.SettingsParser), as every command
builds its parser."""

import importlib
import shlex
from dataclasses import dataclass, field

import pytest

from world_model.utils.flags import SettingsParser, settings_main


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
    (settings,), _ = SettingsParser(Settings, prog="prog", description="").parse_settings(argv)
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


def test_settings_main_hands_the_work_its_settings_and_the_command_to_run_again(capsys):
    seen = []
    argv = ["--kind", "two words", "--lr", "0.5"]
    code = settings_main(Settings, "some.module", "", lambda settings, command: seen.append((settings, command)), argv)
    [(settings, command)] = seen
    assert code == 0 and settings == Settings(lr=0.5, kind="two words")
    assert command == "python -m some.module --kind 'two words' --lr 0.5"
    assert shlex.split(command)[3:] == argv  # quoted so that a shell gives back the same arguments

    def refuse(settings, command):
        raise ValueError("--lr: too large")

    assert settings_main(Settings, "some.module", "", refuse, []) == 2
    assert capsys.readouterr().err.strip() == "error: --lr: too large"


COMMANDS = [  # (module, the arguments it requires)
    ("world_model.training.train", ["--config", "c.yaml", "--data", "d", "--out", "o"]),
    ("world_model.benchmark.table5", ["--preset", "cpu", "--data", "d", "--out", "o"]),
    ("world_model.benchmark.sweep", ["--preset", "cpu", "--data", "d", "--out", "o"]),
    ("world_model.benchmark.attention_decode", ["--out", "o"]),
    ("world_model.training.export", ["--run", "r", "--out", "o", "--command", "c"]),
    ("world_model.benchmark.coherence_rows", ["--runs", "r", "--data", "d", "--out", "o"]),
    ("world_model.evaluation.evaluate", ["--checkpoint", "c", "--data", "d"]),
    ("world_model.evaluation.readout_eval", ["--checkpoint", "c", "--data", "d", "--out", "o"]),
    ("world_model.training.coherence", ["--checkpoint", "c", "--data", "d"]),
    ("world_model.data.rocstories", ["d"]),
    ("world_model.data.synthetic.generator", ["generate", "--episodes", "1", "--out", "o"]),
    ("world_model.data.synthetic.sentences", ["--checkpoint", "c", "--data", "d"]),
    ("world_model.evaluation.calibration", ["--checkpoint", "c", "--heldout", "h", "--out", "o"]),
    ("world_model.generation.sentence_bank", ["--data", "d", "--out", "o"]),
    ("world_model.generation.predict", ["a sentence"]),
    ("pipeline.rollout", ["clip.mp4"]),
    ("pipeline.bench", []),
    ("pipeline.explain_bench", []),
    ("pipeline.pack.evaluate_world", ["--data", "d", "--episodes", "1", "--out", "o"]),
    ("pipeline.pack.grounding", ["measure", "--captioner", "c", "--data", "d"]),
    ("pipeline.pack.round_trip", ["--renderer", "r", "--sentences", "s.txt"]),
    ("pipeline.pack.train_captioner", ["--data", "d", "--out", "o"]),
    ("pipeline.pack.train_renderer", ["--data", "d", "--out", "o"]),
    ("apps.demo.app", []),
]


@pytest.mark.parametrize("module, required", COMMANDS, ids=[m for m, _ in COMMANDS])
def test_every_command_refuses_an_unknown_flag_with_its_usage_and_exit_2(module, required, capsys):
    main = importlib.import_module(module).main
    capsys.readouterr()  # what a library prints while importing (a missing torchvision) is not the command's output
    with pytest.raises(SystemExit) as stop:
        main([*required, "--no-such-flag", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("usage: python -m ")
    assert "error: unrecognized arguments: --no-such-flag 1" in err
