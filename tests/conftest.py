"""Test-wide settings: no test reaches a model hub (none is reachable here, and a retry loop costs minutes)."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


import pytest
import yaml

from pipeline import presets


@pytest.fixture
def offline_pack_absent(tmp_path, monkeypatch):
    """The presets, with the offline one naming folders that do not exist (as in an installation
    without the pack), whether or not the pack is installed here."""
    folder = tmp_path / "presets"
    folder.mkdir()
    for path in presets.PRESET_DIR.glob("*.yaml"):
        preset = yaml.safe_load(path.read_text())
        if path.stem == "offline":
            preset.update({c: str(tmp_path / "no_pack" / c) for c in presets.COMPONENTS})
        (folder / path.name).write_text(yaml.safe_dump(preset))
    monkeypatch.setattr(presets, "PRESET_DIR", folder)
