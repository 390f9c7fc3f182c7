"""What a rollout writes into its run folder: the frames as PNG, rollout.json (`pipeline.record.RolloutRecord`, filled
from the run's parts here), the storyboard, the MP4 and the GIF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from encoders.frames import SampledClip
from encoders.grounding import Grounding
from pipeline.config import OutputConfig, Plan
from pipeline.record import ObservedFrame, RolloutRecord, Sampling, State
from renderers.outputs import write_storyboard
from world_model.models.generation_config import GenerationConfig
from world_model.text.windows import CaptionState
from world_model.utils.video import write_gif, write_video

OBSERVED = "observed/{:03d}.png"  # the i-th sampled frame
RENDERED = "rendered/sample{}_step{:02d}.png"  # sample k (from 0), step s (from 1)


def write_outputs(
    folder: Path,
    record: RolloutRecord,
    observed: list[np.ndarray],
    rendered: list[list[np.ndarray]],
    fps: float,
) -> None:
    """Frames as PNG, the storyboard, and the video (observed frames, then the first sample's future)."""
    for entry, image in zip(record.observed, observed):
        save_png(folder / entry.image, image)
    for prediction, images in zip(record.predictions, rendered):
        for name, image in zip(prediction.images, images):
            save_png(folder / name, image)
    observed_cells = [(img, f"t={e.timestamp_s:.1f}s: {e.caption}") for img, e in zip(observed, record.observed)]
    predicted_cells = [
        (img, f"step {s + 1}: {text}")
        for s, (img, text) in enumerate(zip(rendered[0], record.predictions[0].sentences))
    ]
    write_storyboard(observed_cells, predicted_cells, folder / "storyboard.png", title=Path(record.video).name)
    size = observed[0].shape[:2]
    frames = [fit(img, size) for img in observed + rendered[0]]
    write_video(frames, folder / "rollout.mp4", fps=fps)
    write_gif(frames, folder / "rollout.gif", fps=fps)


def save_png(path: Path, image: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)


def fit(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An (H, W, 3) frame letterboxed into (height, width) = size, so observed and rendered frames share a
    video: scaled to fit whole with its aspect ratio kept, centred on black bars."""
    height, width = size
    if image.shape[:2] == size:
        return image
    scale = min(height / image.shape[0], width / image.shape[1])
    inner_h = max(1, min(height, round(image.shape[0] * scale)))
    inner_w = max(1, min(width, round(image.shape[1] * scale)))
    scaled = np.asarray(Image.fromarray(image).resize((inner_w, inner_h), Image.BICUBIC))
    canvas = np.zeros((height, width, 3), np.uint8)
    top, left = (height - inner_h) // 2, (width - inner_w) // 2
    canvas[top : top + inner_h, left : left + inner_w] = scaled
    return canvas


def window_warnings(window) -> list[str]:
    """Warnings about what the predictor's window lost: every word unknown, or captions cut to its token slots."""
    warnings = []
    if window.tokens and window.unknown == window.tokens:
        warnings.append(
            "every caption word is outside the predictor's vocabulary: the prediction rests on sentence positions alone"
        )
    if window.cut:
        slots = window.token_ids.shape[-1]
        warnings.append(
            f"{len(window.cut)} caption(s) longer than the predictor's {slots} token slots were cut to their first "
            f"{slots} tokens: " + "; ".join(repr(s) for s in window.cut[:3])
        )
    return warnings


def observed_frames(clip: SampledClip, captions: list[str], groundings: list) -> list[ObservedFrame]:
    """Every sampled frame with its caption and grounding (None when unscored; rounded as `Grounding.as_dict`
    rounds), its image under observed/."""
    return [
        ObservedFrame(
            round(fr.timestamp, 3), fr.index, text, Grounding(**g.as_dict()) if g else None, OBSERVED.format(i)
        )
        for i, (fr, text, g) in enumerate(zip(clip, captions, groundings))
    ]


def state_spans(states: list[CaptionState], clip: SampledClip) -> list[State]:
    """The clip's states with the observed frames they cover and the time span of those frames."""
    return [
        State(s.sentence, [s.first, s.last], round(clip[s.first].timestamp, 3), round(clip[s.last].timestamp, 3))
        for s in states
    ]


def sampling_record(
    plan: Plan, steps: int, generation: GenerationConfig, readout: str, output: OutputConfig
) -> Sampling:
    """The run's settings as used; `samples` is the futures drawn (one when greedy)."""
    f = plan.frames
    return Sampling(
        interval_s=f.seconds,
        num_frames=f.num_frames,
        max_frames=f.max_frames,
        frames_per_state=f.frames_per_state,
        merge_repeats=f.merge_repeats,
        steps=steps,
        temperature=generation.temperature,
        top_k=generation.top_k,
        seed=generation.seed,
        precision=generation.precision,
        readout=readout,
        samples=generation.futures,
        init_from_last_frame=output.init_from_last_frame,
    )
