"""How well a trained captioner folder reads held-out state strips: exact matches overall and per scene, and its
commonest confusions (the held-out part of `pipeline.pack.train_captioner`'s metrics.json)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from encoders.captioner import HFCaptioner
from encoders.world_dataset import StateSet
from world_model.text.vocab import same_sentence


def heldout_report(folder: Path, states: StateSet, batch_size: int = 64, top: int = 15) -> dict:
    """Caption ``states`` with the saved model through ``HFCaptioner`` (what the pipeline runs) and score
    exact matches overall and per scene type; lists the ``top`` most common (sentence, caption) confusions."""
    captioner = HFCaptioner.from_pretrained(folder, device="cpu", batch_size=batch_size)
    captions = captioner(list(states.images), progress="held-out captions")
    scenes = [states.records[e]["scene"] for e in states.episode]
    hits = [same_sentence(c, s) for c, s in zip(captions, states.sentences)]
    per_scene = {
        scene: float(np.mean([h for h, s in zip(hits, scenes) if s == scene])) for scene in sorted(set(scenes))
    }
    confusions = Counter((s, c) for h, s, c in zip(hits, states.sentences, captions) if not h)
    return {
        "strips": len(states),
        "exact_match": float(np.mean(hits)),
        "per_scene": per_scene,
        "strips_per_scene": dict(sorted(Counter(scenes).items())),
        "confusions": [{"sentence": s, "caption": c, "count": n} for (s, c), n in confusions.most_common(top)],
    }
