"""Probe: how strong is the bag-of-words dual encoder floor when its settings are chosen? Fits the floor
(world_model/evaluation/floors/dual_encoder.py) at a few settings on the training stories and reads each one's
coherence report (Story Cloze val and test, retrieval); the setting to quote is the one of highest val accuracy.

    python probes/coherence/probe_dual_encoder.py results/coherence/dual_encoder_settings.json
"""

import json
import sys
import time

from world_model.data.rocstories import encode_windows, load_cloze_halves, load_corpus
from world_model.evaluation import coherence as coh
from world_model.evaluation.floors.dual_encoder import DualEncoderSettings, dual_encoder_scorer, fit_dual_encoder
from world_model.generation.predict import SHIPPED_CHECKPOINT
from world_model.models.registry import load_predictor
from world_model.utils.files import write_json_atomic

DATA = "../shared/data/rocstories"
GRID = [
    DualEncoderSettings(),  # what evaluate fits
    DualEncoderSettings(same_story=True),
    DualEncoderSettings(dim=128),
    DualEncoderSettings(dim=256),
    DualEncoderSettings(dim=512),
    DualEncoderSettings(lr=1e-3, epochs=12),
    DualEncoderSettings(dim=128, same_story=True, epochs=12),
]

model, vocab, _ = load_predictor(SHIPPED_CHECKPOINT)
windows = encode_windows(load_corpus(DATA).train, vocab, model.config.n_tokens)
halves = load_cloze_halves(DATA)
rows = []
for settings in GRID:
    start = time.perf_counter()
    encoder, fitted = fit_dual_encoder(windows, len(vocab), settings)
    report = coh.coherence_report(
        dual_encoder_scorer(encoder), halves, vocab, model.config.n_tokens, coh.LIKELIHOOD_FREE_RULES
    )
    rows.append(
        {**fitted, **{k: report[k] for k in ("val", "test", "retrieval")}, "seconds": time.perf_counter() - start}
    )
    print(json.dumps(rows[-1]), flush=True)
best = max(rows, key=lambda r: r["val"])
write_json_atomic(sys.argv[1], {"command": "python " + " ".join(sys.argv), "rows": rows, "chosen_on_val": best})
