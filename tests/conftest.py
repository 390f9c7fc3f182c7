"""Test-wide settings: no test reaches a model hub (none is reachable here, and a retry loop costs minutes) or writes
into the user's cache folder."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# what the commands cache for the user (evaluate's floors) goes to a folder of this run, not the user's ~/.cache
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="test-cache-")


import signal

import pytest
import torch
import yaml

from pipeline import presets

atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)

# A shell that starts the suite in the background (no job control, or nohup) leaves SIGINT (or SIGHUP) ignored, and
# the commands rightly keep an ignored stop signal ignored; the signal tests need them live, in this process and in
# the commands it starts, so they get Python's usual dispositions, wherever the suite was started from.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
for _stop in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_stop) is signal.SIG_IGN:
        signal.signal(_stop, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """A command run in this process may set torch's thread count (--threads); the next test gets it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


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


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A tiny rollout set-up of the real architectures: {captioner (BLIP), renderer (SD), predictor, clip} paths."""
    import torch

    from pipeline.tiny_pack import make_tiny_blip, make_tiny_sd
    from tests.model_factories import one_torch_thread, write_test_clip
    from world_model.models.four_tensor import FourTensorModel
    from world_model.models.four_tensor_config import FourTensorConfig
    from world_model.text.vocab import Vocabulary

    root = tmp_path_factory.mktemp("models")
    with one_torch_thread():
        vocab = Vocabulary.build(["a ball falls down ."])
        torch.manual_seed(0)
        FourTensorModel(FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1)).save_pretrained(
            root / "predictor", vocab=vocab
        )
        yield {
            "captioner": str(make_tiny_blip(root / "blip")),
            "renderer": str(make_tiny_sd(root / "sd")),
            "predictor": str(root / "predictor"),
            "clip": write_test_clip(root / "clip.mp4", seconds=3.0, fps=10),
        }
