"""rollout.json, typed: the record a video rollout fills, writes into its run folder and reads back.

`RolloutRecord` is to a run folder what diffusers' `StableDiffusionPipelineOutput` is to a pipeline call: a dataclass
whose fields say what a run produced. Its docstrings and those of the dataclasses it nests are the one description
of rollout.json; the JSON's keys are the field names, in field order.

    record = RolloutRecord.from_json(run_dir / "rollout.json")  # checked: a ValueError names the field at fault
    record.predictions[0].sentences
    record.write(run_dir / "rollout.json")  # the same JSON, byte for byte

Times are in seconds (rounded to 3 decimals), image paths relative to the run folder.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path

from encoders.grounding import Grounding
from world_model.utils.files import write_json_atomic


@dataclass
class ClipInfo:
    """The clip's stream: `fps`, `duration_s` as the container says, `width` and `height` as displayed (after
    `rotation`, degrees clockwise: 0, 90, 180 or 270)."""

    fps: float
    duration_s: float
    width: int
    height: int
    rotation: int


@dataclass
class Models:
    """The components that ran (hub ids or folders) and the torch `device`."""

    captioner: str
    renderer: str
    predictor: str
    device: str


@dataclass
class Sampling:
    """The run's settings as used (`pipeline.config.FrameSampling`, `GenerationConfig`, `OutputConfig`), the
    preset's defaults filled in.

    `interval_s` (seconds between sampled frames) or `num_frames` (evenly spaced; else null), at most `max_frames`;
    `frames_per_state` frames tiled into each captioned strip; `merge_repeats`: repeated captions are one state;
    `steps` predicted states per sample; `temperature`, `top_k`, `seed` and `precision` of the predictor;
    `readout`: how states were read off and so which probability the explanations report, e.g.
    "sentences (132 known, confidence temperature 2.57)"; `samples`: futures drawn (one when greedy);
    `init_from_last_frame`: renders went image-to-image from the last observed frame.
    """

    interval_s: float
    num_frames: int | None
    max_frames: int
    frames_per_state: int
    merge_repeats: bool
    steps: int
    temperature: float
    top_k: int | None
    seed: int
    precision: str
    readout: str
    samples: int
    init_from_last_frame: bool


@dataclass
class ObservedFrame:
    """One sampled frame: its presentation time `timestamp_s`, its `frame_index` in the stream, its `caption`, its
    `grounding` (`encoders.grounding.Grounding`; null from a captioner that gives no score) and its `image`."""

    timestamp_s: float
    frame_index: int
    caption: str
    grounding: Grounding | None
    image: str


@dataclass
class GroundingVerdict:
    """The clip's verdict from its frames' groundings (`encoders.grounding.clip_verdict`): `verdict` is "inside",
    "partly outside", "outside", "uncalibrated" or "unscored"; `flagged` of `frames` frames lie outside the
    captioner's world; `kind` is the score's kind (null when unscored)."""

    verdict: str
    frames: int
    flagged: int
    kind: str | None


@dataclass
class State:
    """A run of consecutive observed frames whose captions say the same `sentence` (one state of the clip;
    `world_model.text.windows.caption_states`): `observed` is [first, last], indices into the record's `observed`,
    and `start_s`, `end_s` their timestamps."""

    sentence: str
    observed: list[int]
    start_s: float
    end_s: float


@dataclass
class Window:
    """The predictor's input: the T state sentences it read ("" for left padding, oldest first) and their
    (T, N) token ids."""

    states: list[str]
    token_ids: list[list[int]]


@dataclass
class OutOfVocabulary:
    """Caption words outside the predictor's vocabulary: `unknown` of `tokens` caption tokens, their `rate`
    (4 decimals) and the distinct `unknown_words` in order of appearance."""

    tokens: int
    unknown: int
    rate: float
    unknown_words: list[str]


@dataclass
class Prediction:
    """One sampled future: its `sentences` and (steps, N) `token_ids`, one per predicted step; `explanations`, one
    record per step as `world_model.generation.explain` defines them (probability, alternatives, attention,
    drew_on, copy), or null when explanations are off or the predictor cannot give them; the rendered `images`."""

    sentences: list[str]
    token_ids: list[list[int]]
    explanations: list[dict] | None
    images: list[str]


@dataclass
class RolloutRecord:
    """rollout.json: one video rollout.

    `video` is the clip's path and `clip` its stream; `preset` the preset that ran and `preset_reason` why it was
    chosen; `models` and `sampling` what ran with which settings; `observed` every sampled frame and `grounding` the
    clip's verdict on them; `states` the frames' distinct states, of which `window` holds the last the predictor
    read, and `oov` its unknown words; `predictions` one future per sample; `warnings` what a reader should know
    (frames outside the captioner's world, frames thinned or a stream cut short, captions unknown or cut to the
    predictor's token slots); `timings_s` each stage's seconds (sample_frames, load_models, caption, predict,
    render, write_outputs).
    """

    video: str
    clip: ClipInfo
    preset: str
    preset_reason: str
    models: Models
    sampling: Sampling
    observed: list[ObservedFrame]
    grounding: GroundingVerdict
    states: list[State]
    window: Window
    oov: OutOfVocabulary
    predictions: list[Prediction]
    warnings: list[str]
    timings_s: dict[str, float]

    @classmethod
    def from_json(cls, source: str | Path | dict) -> RolloutRecord:
        """The record in a rollout.json file (a path) or its parsed content (a dict). A field missing, unknown or
        of the wrong type raises ValueError naming it, e.g. `predictions[0].sentences`."""
        if isinstance(source, dict):
            return load(cls, source, "")
        try:
            return load(cls, json.loads(Path(source).read_text()), "")
        except ValueError as err:  # json.JSONDecodeError included
            raise ValueError(f"{source}: {err}") from None

    def to_json(self) -> dict:
        """The record as rollout.json's JSON object."""
        return asdict(self)

    def write(self, path: Path) -> None:
        """Write the record to `path` (indented, non-ASCII kept), staged and renamed."""
        write_json_atomic(path, self.to_json(), ensure_ascii=False)


def load(kind, value, where: str):
    """`value`, parsed JSON, checked against `kind` (a field's type) and built into it; `where` names the value."""
    name = where or "the record"
    if is_dataclass(kind):
        if not isinstance(value, dict):
            raise ValueError(f"{name}: expected an object, got {type(value).__name__}")
        names = [f.name for f in fields(kind)]
        missing = [n for n in names if n not in value]
        unknown = [k for k in value if k not in names]
        if missing or unknown:
            said = [f"missing field {join(where, n)!r}" for n in missing]
            said += [f"unknown field {join(where, k)!r}" for k in unknown]
            raise ValueError("; ".join(said))
        hints = typing.get_type_hints(kind)
        return kind(**{n: load(hints[n], value[n], join(where, n)) for n in names})
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):  # X | None
        (inner,) = [a for a in args if a is not type(None)]
        return None if value is None else load(inner, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{name}: expected a list, got {type(value).__name__}")
        return [load(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{name}: expected an object, got {type(value).__name__}")
        return {k: load(args[1], v, join(where, k)) for k, v in value.items()}
    bool_as_number = kind in (int, float) and isinstance(value, bool)  # JSON's true is no number
    if bool_as_number or not isinstance(value, (int, float) if kind is float else kind):
        raise ValueError(f"{name}: expected {kind.__name__}, got {type(value).__name__} {value!r:.40}")
    return value


def join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
