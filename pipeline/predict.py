"""Predict the next sentences with a pipeline preset's predictor and readout: the text half of the video loop.

    python -m pipeline.predict --preset hub "a man riding a bike down a street." "a man riding a bike on a road."
    python -m pipeline.predict --preset offline --steps 3 "the ball rolls to the right." "the ball hits the wall."

As `python -m world_model.generation.predict`, but the predictor folder and its readout are the preset's
(`configs/pipeline/NAME.yaml`), exactly as `python -m pipeline.rollout --preset NAME` takes them: the hub preset
ranks the sentence bank with the coherence head. `--readout` or `--coherence` choose another readout, and
`--checkpoint` replaces the preset's predictor (and with it the preset's readout, as `--predictor` does in the
rollout). Only the predictor is loaded: no captioner, renderer or network.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import argparse
import sys
from dataclasses import dataclass, field

from pipeline.presets import PipelinePreset, available_presets, load_preset
from world_model.generation.predict import MAX_STEPS, add_sentences_and_switches, predict, print_prediction
from world_model.models.generation_config import GenerationConfig
from world_model.utils.flags import settings_main

PRESETS = [name for name in available_presets() if name != "auto"]  # auto picks captioner and renderer: not needed


@dataclass
class PresetPrediction:
    """Which preset's predictor the command asks, and for how many sentences."""

    preset: str = field(default="hub", metadata={"help": f"pipeline preset: {', '.join(PRESETS)} (default hub)"})
    checkpoint: str | None = field(
        default=None, metadata={"help": "predictor folder in place of the preset's (its readout is then dropped)"}
    )
    steps: int = field(default=1, metadata={"help": f"sentences to predict (default 1, at most {MAX_STEPS})"})

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"--preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")


def preset_for(settings: PresetPrediction) -> PipelinePreset:
    """The preset named by `settings`, its predictor replaced by `settings.checkpoint` when one is given."""
    preset = load_preset(settings.preset)
    return preset if settings.checkpoint is None else preset.with_models({"predictor": settings.checkpoint})


def preset_predict(sentences: list[str], settings: PresetPrediction, generation: GenerationConfig) -> dict:
    """`world_model.generation.predict.predict` with the preset's predictor and readout (unless `generation` names
    its own); the result says which preset it used."""
    preset = preset_for(settings)
    result = predict(sentences, preset.predictor, settings.steps, preset.generation_for(generation))
    return {"preset": preset.name, **result}


def main(argv: list[str] | None = None) -> int:
    return settings_main(
        (GenerationConfig, PresetPrediction),
        "pipeline.predict",
        __doc__.split("\n\n")[0],
        preset_predict_command,
        argv,
        arguments=add_sentences_and_switches,
        usage_on_bad_setting=False,
    )


def preset_predict_command(
    generation: GenerationConfig, settings: PresetPrediction, args: argparse.Namespace, command: str
) -> None:
    """The command's work: predict from the sentences with the preset's predictor, then print the result."""
    print_prediction(preset_predict(args.sentences, settings, generation), args.json, args.explain)


if __name__ == "__main__":
    sys.exit(main())
