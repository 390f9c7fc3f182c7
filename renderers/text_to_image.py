"""Text-to-image renderers.

``DiffusersRenderer`` renders one image per prompt with a diffusers pipeline: any checkpoint that
``AutoPipelineForText2Image`` knows (Stable Diffusion, SD-Turbo, SDXL, ...), and otherwise any
``DiffusionPipeline`` folder, including custom pipeline classes saved with ``save_pretrained``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import diffusers
import numpy as np
import torch
from diffusers import AutoPipelineForImage2Image, AutoPipelineForText2Image, DiffusionPipeline
from PIL import Image
from safetensors import SafetensorError

from world_model.utils.hub import PIPELINE_INDEX, ModelLoadError, default_device, explain_load_failure, load_model_files

DEFAULT_RENDERER = "stabilityai/sd-turbo"
# How diffusers' ModelMixin.from_pretrained words its warnings about unexpected and missing checkpoint keys.
UNLOADED_WEIGHT_PHRASES = ("were not used when initializing", "were not initialized from the model checkpoint")


@dataclass(frozen=True)
class KnownPipeline:
    """A model recognised by its pipeline's own config (pipeline class, scheduler class and timestep spacing),
    not by its hub id, so a local copy is recognised too; ``settings`` are its model card's."""

    model: str
    pipeline_class: str
    scheduler_class: str
    timestep_spacing: str
    settings: dict

    def matches(self, pipeline: DiffusionPipeline) -> bool:
        scheduler = getattr(pipeline, "scheduler", None)
        return (
            type(pipeline).__name__ == self.pipeline_class
            and type(scheduler).__name__ == self.scheduler_class
            and scheduler.config.get("timestep_spacing") == self.timestep_spacing
        )


# Adversarially distilled one-step models: their cards sample 1 step without guidance, at 512x512.
TURBO_SETTINGS = {"num_inference_steps": 1, "guidance_scale": 0.0, "height": 512, "width": 512}
KNOWN_PIPELINES = (
    KnownPipeline(
        "stabilityai/sd-turbo", "StableDiffusionPipeline", "EulerDiscreteScheduler", "trailing", TURBO_SETTINGS
    ),
    KnownPipeline(
        "stabilityai/sdxl-turbo",
        "StableDiffusionXLPipeline",
        "EulerAncestralDiscreteScheduler",
        "trailing",
        TURBO_SETTINGS,
    ),
)


def known_settings(pipeline: DiffusionPipeline) -> dict:
    """The model card's sampling settings when ``pipeline`` is recognised (``KNOWN_PIPELINES``), else {}."""
    return next((dict(known.settings) for known in KNOWN_PIPELINES if known.matches(pipeline)), {})


class Renderer(Protocol):
    name: str
    continues: bool  # whether an image is drawn to continue the one before it (the loop then always passes it)

    def __call__(
        self, prompts: list[str], seed: int = 0, init_images: list[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """One (H, W, 3) uint8 RGB image per prompt, in order; ``init_images[i]`` (H', W', 3) uint8
        RGB, when given, is the starting point for prompt ``i``."""
        ...


class DiffusersRenderer:
    """Render prompts one at a time, each with its own ``torch.Generator`` seeded with ``seed``.

    Every prompt starts from the same seed, so an image depends only on (prompt, seed, init image)
    and not on its position in the list; on CPU the result is bit-for-bit reproducible.  The
    pipeline's progress bar is disabled; callers show their own progress.

    An init image is what the image continues: a pipeline that reads the image before it (the offline pack's
    renderer with ``previous_strip``; ``continues`` is then True) gets it as ``previous``; any other pipeline
    starts image-to-image from it at ``strength`` (its own ``image``/``strength`` arguments where its call takes
    them, else diffusers' image-to-image counterpart).
    """

    def __init__(self, pipeline: DiffusionPipeline, name: str, settings: dict, strength: float = 0.6):
        if not 0 < strength <= 1:
            raise ValueError(f"strength must be in (0, 1], got {strength}")
        self.pipeline = pipeline
        self.name = name
        self.settings = settings  # keyword arguments for every pipeline call
        self.strength = strength
        self._image_to_image: DiffusionPipeline | None = None

    @property
    def continues(self) -> bool:
        """Whether the pipeline draws each image to continue the one before it (reads a ``previous`` image)."""
        return bool(self.pipeline.config.get("previous_strip", False))

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str | Path = DEFAULT_RENDERER,
        device: str | torch.device | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        height: int | None = None,
        width: int | None = None,
        strength: float = 0.6,
        pipeline_class: type[DiffusionPipeline] | str | None = None,
        trust_remote_code: bool = False,
    ) -> DiffusersRenderer:
        """Load a pipeline from a hub id or a ``save_pretrained`` folder; fp16 on CUDA, fp32 elsewhere.

        Settings left ``None`` come from the model card when the pipeline's config is recognised
        (``KNOWN_PIPELINES``: sd-turbo and sdxl-turbo, from a hub id or a local copy), else from the
        pipeline's own defaults.  ``strength`` is how far image-to-image moves from the init image.
        The files are found as ``world_model.utils.hub.load_model_files`` says: the fp16 variant where it
        exists (cast to fp32 on CPU), a cached hub id without the network.
        A folder whose pipeline class diffusers does not provide loads with ``pipeline_class`` (the
        class itself, or its import path ``"package.module:ClassName"`` as a YAML preset names it),
        or, when its code ships in the folder (``model_index.json`` ``_class_name``
        ``["pipeline", "ClassName"]`` next to ``pipeline.py``), with ``trust_remote_code=True``.

        Raises ``ModelLoadError`` saying whether the folder lacks files or the hub id is not cached, and
        when a component's checkpoint keys do not match its model (which diffusers would only log).
        """
        if isinstance(pipeline_class, str):
            pipeline_class = resolve_pipeline_class(pipeline_class)
        device = default_device(device)
        dtype = torch.float16 if device.type == "cuda" else torch.float32

        def load(variant: str | None, local_files_only: bool) -> DiffusionPipeline:
            options = dict(dtype=dtype, variant=variant, local_files_only=local_files_only)
            return _load_pipeline(model_id_or_path, options, pipeline_class, trust_remote_code)

        with failing_on_unloaded_weights(model_id_or_path):
            try:
                pipeline = load_model_files(load, model_id_or_path, PIPELINE_INDEX)
            except (OSError, ValueError, SafetensorError) as error:
                raise ModelLoadError(explain_load_failure(model_id_or_path, PIPELINE_INDEX, error)) from error
        pipeline.to(device)
        pipeline.set_progress_bar_config(disable=True)
        given = dict(num_inference_steps=num_inference_steps, guidance_scale=guidance_scale, height=height, width=width)
        settings = known_settings(pipeline) | {k: v for k, v in given.items() if v is not None}
        return cls(pipeline, str(model_id_or_path), settings, strength)

    def __call__(
        self, prompts: list[str], seed: int = 0, init_images: list[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """Prompts -> one (H, W, 3) uint8 RGB image each.

        With ``init_images`` (one (H', W', 3) uint8 RGB image per prompt) the image-to-image
        pipeline built from the same components starts from them; they are resized to the
        configured ``height``/``width`` if set (as the turbo cards resize theirs to 512x512),
        otherwise the output keeps their size (rounded down to what the model accepts).
        """
        if init_images is not None and len(init_images) != len(prompts):
            raise ValueError(f"{len(init_images)} init images for {len(prompts)} prompts")
        images = []
        for i, prompt in enumerate(prompts):
            generator = torch.Generator("cpu").manual_seed(seed)  # CPU noise: same images on any device
            if init_images is None:
                output = _call(self.pipeline, prompt=prompt, generator=generator, output_type="np", **self.settings)
            else:
                output = self._render_from(init_images[i], prompt, generator)
            images.append(_to_uint8(output.images[0]))
        return images

    def _render_from(self, init_image: np.ndarray, prompt: str, generator: torch.Generator):
        if self.continues:
            return _call(self.pipeline, prompt=prompt, previous=[init_image], generator=generator, output_type="np",
                         **self.settings)  # fmt: skip
        if {"image", "strength"} <= set(inspect.signature(self.pipeline.__call__).parameters):
            return _call(self.pipeline, prompt=prompt, image=[init_image], strength=self.strength,
                         generator=generator, output_type="np", **self.settings)  # fmt: skip
        image = Image.fromarray(init_image)
        if "height" in self.settings and "width" in self.settings:
            image = image.resize((self.settings["width"], self.settings["height"]), Image.Resampling.LANCZOS)
        settings = dict(self.settings)
        if "num_inference_steps" in settings:
            # img2img runs int(steps * strength) steps; keep at least one (1-step SD-Turbo would run none).
            settings["num_inference_steps"] = max(settings["num_inference_steps"], math.ceil(1 / self.strength))
        return _call(
            self.image_to_image(),
            prompt=prompt,
            image=image,
            strength=self.strength,
            generator=generator,
            output_type="np",
            **settings,
        )

    def image_to_image(self) -> DiffusionPipeline:
        """The image-to-image pipeline sharing this pipeline's components (built on first use)."""
        if self._image_to_image is None:
            try:
                self._image_to_image = AutoPipelineForImage2Image.from_pipe(self.pipeline)
            except ValueError as error:
                raise ValueError(f"{type(self.pipeline).__name__} has no image-to-image counterpart") from error
            self._image_to_image.set_progress_bar_config(disable=True)
        return self._image_to_image


@contextmanager
def failing_on_unloaded_weights(source: str | Path) -> Iterator[None]:
    """Raise ``ModelLoadError`` after a load in which diffusers reported checkpoint keys a model did not load
    (missing or unexpected): diffusers only logs them, and the rollout silences its log. Its other log records
    reach the log's handlers as before, at the level it was set to."""
    logger = logging.getLogger("diffusers")
    records: list[logging.LogRecord] = []
    collect = logging.Handler()
    collect.emit = records.append
    level, handlers, shown = logger.level, logger.handlers[:], logger.getEffectiveLevel()
    logger.handlers = [collect]
    logger.setLevel(min(shown, logging.WARNING))
    try:
        yield
    finally:
        logger.handlers = handlers
        logger.setLevel(level)
        for record in records:
            if record.levelno >= shown and not _reports_unloaded_weights(record):
                logger.handle(record)
    unloaded = [r.getMessage().split("\n")[0] for r in records if _reports_unloaded_weights(r)]
    if unloaded:
        raise ModelLoadError(f"{source}: a checkpoint does not match its model's weights: " + " | ".join(unloaded))


def _reports_unloaded_weights(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return any(phrase in message for phrase in UNLOADED_WEIGHT_PHRASES)


def resolve_pipeline_class(path: str) -> type[DiffusionPipeline]:
    """The ``DiffusionPipeline`` subclass named ``"package.module:ClassName"``; ``ValueError`` saying which part
    does not resolve."""
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"pipeline_class {path!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"pipeline_class {path!r}: cannot import module {module_name!r} ({error})") from error
    pipeline_class = getattr(module, class_name, None)
    if not (isinstance(pipeline_class, type) and issubclass(pipeline_class, DiffusionPipeline)):
        found = "nothing" if pipeline_class is None else type(pipeline_class).__name__
        raise ValueError(
            f"pipeline_class {path!r}: module {module_name!r} has {found} named {class_name!r}, "
            "not a DiffusionPipeline subclass"
        )
    return pipeline_class


def _load_pipeline(
    source: str | Path, options: dict, pipeline_class: type[DiffusionPipeline] | None, trust_remote_code: bool
) -> DiffusionPipeline:
    """The pipeline at ``source``, loaded with ``options`` (dtype, variant, local_files_only)."""
    if pipeline_class is not None:
        return pipeline_class.from_pretrained(source, **options)
    try:
        return AutoPipelineForText2Image.from_pretrained(source, **options)
    except ValueError as error:
        if "AutoPipeline can't find" not in str(error):  # raised for classes AutoPipeline does not map
            raise
    class_name = DiffusionPipeline.load_config(source, local_files_only=options["local_files_only"])["_class_name"]
    if isinstance(class_name, str) and not hasattr(diffusers, class_name):
        raise ValueError(
            f"model_index.json names the pipeline class {class_name!r}, which diffusers does not provide: pass "
            f"pipeline_class={class_name}, or ship its code in the folder as pipeline.py with _class_name "
            f'["pipeline", "{class_name}"] and pass trust_remote_code=True'
        )
    return DiffusionPipeline.from_pretrained(source, trust_remote_code=trust_remote_code, **options)


def _call(pipeline: DiffusionPipeline, **kwargs):
    """Call ``pipeline`` with the keyword arguments its ``__call__`` accepts (custom pipelines may
    lack e.g. ``guidance_scale``)."""
    parameters = inspect.signature(pipeline.__call__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in parameters}
    return pipeline(**kwargs)


def _to_uint8(image) -> np.ndarray:
    """A PIL image or an (H, W, 3) array (uint8, or float in [0, 1]) -> (H, W, 3) uint8 RGB."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    array = np.asarray(image)
    if array.dtype == np.uint8:
        return array
    return (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
