"""Pipeline presets (`configs/pipeline/*.yaml`) and the `auto` choice between hub and offline models."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from world_model.utils.hub import PIPELINE_INDEX, model_folder

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PRESET_DIR = PROJECT_ROOT / "configs" / "pipeline"
COMPONENTS = ("captioner", "renderer", "predictor")
HUB_CHECK_TIMEOUT_S = 5.0


class PresetError(ValueError):
    """A preset is unknown, malformed, or names models that are not available."""


@dataclass(frozen=True)
class PipelinePreset:
    """A preset: the three models (hub id or folder) and their options, as `configs/pipeline/<name>.yaml` holds them."""

    name: str
    captioner: str
    renderer: str
    predictor: str
    frames_per_state: int = 1  # YAML `sampling.frames_per_state`: frames tiled into each state strip
    merge_repeats: bool = True  # YAML `sampling.merge_repeats`: consecutive identical captions are one state
    captioner_options: dict = field(default_factory=dict)  # keyword arguments of HFCaptioner.from_pretrained
    renderer_options: dict = field(default_factory=dict)  # keyword arguments of DiffusersRenderer.from_pretrained
    readout: dict = field(default_factory=dict)  # YAML `readout`: the predictor's readout and coherence by default

    def with_models(self, overrides: dict[str, str]) -> PipelinePreset:
        """This preset with some components replaced (hub id or folder); a replaced captioner or renderer drops
        the preset's options, and a replaced predictor its readout, which belong to the model they replace."""
        options = {f"{c}_options": {} for c in overrides if c in ("captioner", "renderer")}
        readout = {"readout": {}} if "predictor" in overrides else {}
        return replace(self, **{c: resolve_model_path(v) for c, v in overrides.items()}, **options, **readout)

    def generation_for(self, generation):
        """`generation` (a GenerationConfig) with the preset's readout, unless it names its own (a readout other
        than auto, or the coherence head)."""
        if not self.readout or generation.readout != "auto" or generation.coherence:
            return generation
        return replace(generation, **self.readout)


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) + ["auto"]


def resolve_model_path(name: str) -> str:
    """A preset's model entry: a path relative to the project root if it exists there, else as given."""
    local = PROJECT_ROOT / name
    return str(local) if local.exists() else name


def load_preset(name: str) -> PipelinePreset:
    """The preset `configs/pipeline/<name>.yaml`, model entries resolved (`resolve_model_path`)."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise PresetError(f"unknown preset {name!r}; choose one of: {', '.join(available_presets())}")
    entries = yaml.safe_load(path.read_text()) or {}
    missing = [c for c in COMPONENTS if c not in entries]
    if missing:
        raise PresetError(f"preset {path} names no {', '.join(missing)}")
    unknown = sorted(set(entries) - {*COMPONENTS, "sampling", "captioner_options", "renderer_options", "readout"})
    if unknown:
        raise PresetError(f"preset {path}: unknown entries {', '.join(unknown)}")
    return PipelinePreset(
        name=name,
        **{c: resolve_model_path(str(entries[c])) for c in COMPONENTS},
        frames_per_state=int((entries.get("sampling") or {}).get("frames_per_state", 1)),
        merge_repeats=bool((entries.get("sampling") or {}).get("merge_repeats", True)),
        captioner_options=dict(entries.get("captioner_options") or {}),
        renderer_options=dict(entries.get("renderer_options") or {}),
        readout=check_readout(path, dict(entries.get("readout") or {})),
    )


def check_readout(path: Path, readout: dict) -> dict:
    """A preset's `readout` entry: at most `readout` (a readout name) and `coherence` (true or false)."""
    unknown = sorted(set(readout) - {"readout", "coherence"})
    if unknown or not isinstance(readout.get("coherence", False), bool):
        raise PresetError(f"preset {path}: readout takes readout (a name) and coherence (true or false), got {readout}")
    return readout


def missing_offline_models(preset: PipelinePreset) -> list[str]:
    """Components of an offline preset whose folder is not in this installation."""
    return [c for c in COMPONENTS if not Path(getattr(preset, c)).is_dir()]


def hub_model_available(model_id: str) -> bool:
    """True when `model_id` is a local folder, is in the Hugging Face cache with the weights a load reads
    (`world_model.utils.hub.model_folder`), or the hub answers for it."""
    if any(model_folder(model_id, index) is not None for index in ("config.json", PIPELINE_INDEX)):
        return True
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(model_id, timeout=HUB_CHECK_TIMEOUT_S)
        return True
    except Exception:
        return False


def choose_preset(name: str) -> tuple[PipelinePreset, str]:
    """Resolve `name` (hub, offline, or auto) to a preset and a sentence that says why it was chosen."""
    if name != "auto":
        preset = load_preset(name)
        if name == "offline" and missing_offline_models(preset):
            raise PresetError(offline_missing_message(preset))
        unavailable = [m for m in (preset.captioner, preset.renderer) if name == "hub" and not hub_model_available(m)]
        if unavailable:  # fail now, not after minutes of download retries
            from huggingface_hub import constants

            raise PresetError(
                f"--preset hub: {', '.join(unavailable)} neither in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                "nor reachable on the hub (no network, or HF_HUB_OFFLINE is set); use --preset offline (the bundled "
                "pack) or download the models where the hub is reachable and copy the cache"
            )
        return preset, f"preset {name!r} requested"
    hub = load_preset("hub")
    unavailable = [m for m in (hub.captioner, hub.renderer) if not hub_model_available(m)]
    if not unavailable:
        return hub, "auto: the hub models are cached or reachable"
    offline = load_preset("offline")
    if missing_offline_models(offline):
        raise PresetError(
            f"auto: the hub models {', '.join(unavailable)} are neither cached nor reachable, and "
            + offline_missing_message(offline)
        )
    return offline, f"auto: {', '.join(unavailable)} not cached or reachable; using the offline pack"


def offline_missing_message(preset: PipelinePreset) -> str:
    missing = missing_offline_models(preset)
    return (
        f"the offline model pack is not in this installation (missing: {', '.join(getattr(preset, c) for c in missing)}). "
        "Use --preset hub with internet access, or name local models with --captioner, --renderer and --predictor."
    )
