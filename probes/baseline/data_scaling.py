"""The floors and the models against the number of training stories: is the baseline's gap to counting a matter of data?

Usage: python data_scaling.py DATA_DIR OUT.json K [K ...] [--run K:RUN_DIR ...]
For each K the count floors are fitted on the first K training stories of the pool that `training.holdout_stories:
2000` trains on (every story but the last 2,000; settings chosen on a held-out slice of those K, as everywhere) and
scored on the last 2,000 training stories and on the 3,742 cloze stories. Each --run K:RUN_DIR (a run trained with
`--train-subset K` and the holdout, its selected checkpoint in RUN_DIR/best) is scored on the same two sets: L_S(4)
as the paper defines it, free-running for the flat baseline.
"""

import argparse
import json
from pathlib import Path

from probe_tokens import token_ce

from world_model.data.rocstories import build_vocabulary, encode_windows, load_corpus
from world_model.evaluation.evaluate import encode_stories, load_validation_stories
from world_model.evaluation.floors import FLOORS, floor_metrics, select_floors
from world_model.models.registry import load_model
from world_model.text.vocab import PAD_ID

HOLDOUT = 2000

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("data", type=Path)
parser.add_argument("out", type=Path)
parser.add_argument("stories", type=int, nargs="+")
parser.add_argument("--run", action="append", default=[], help="K:RUN_DIR")
args = parser.parse_args()

corpus = load_corpus(args.data)
runs = [(int(k), Path(d)) for k, d in (r.split(":", 1) for r in args.run)]
vocab = build_vocabulary(corpus)  # over the whole pool, as every run builds it
pool, held = corpus.split(HOLDOUT)
windows = {
    "heldout": encode_windows(held, vocab, 16),
    "cloze": encode_stories(load_validation_stories(args.data), vocab, 16)[0],
}
result = {"heldout_stories": HOLDOUT, "floors": {}, "runs": []}
for k in args.stories:
    floors = select_floors(encode_windows(pool[:k], vocab, 16), len(vocab))["floors"]
    result["floors"][k] = {
        name: {
            split: round(floor_metrics(floors[name], w, accuracy=False)["last_ce"], 4) for split, w in windows.items()
        }
        for name in FLOORS
    }
    print(k, result["floors"][k], flush=True)
for k, run in runs:
    model = load_model(run / "best", device="cpu").eval()
    scores = {}
    for split, w in windows.items():
        ce = token_ce(model, w)
        scores[split] = round(ce[w[:, 4] != PAD_ID].mean().item(), 4)
    summary = json.loads((run / "summary.json").read_text())
    record = {"stories": k, "run": str(run), "model_type": summary["model_type"]}
    record["seed"] = summary["config"]["training"]["seed"]
    record |= {key: summary[key] for key in ("best_epoch", "last_epoch", "stop_reason")}
    result["runs"].append({**record, **scores})
    print(result["runs"][-1], flush=True)
args.out.write_text(json.dumps(result, indent=2) + "\n")
