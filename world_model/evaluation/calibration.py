"""How sure, checked: a predictor's next-state probabilities against the synthetic world's exact distributions.

For every second t >= 1 of every episode, the predictor reads the window of the sentences before t (as in training,
`world_model.data.synthetic.episodes.sentence_windows`) and gives each known sentence c a probability

    q_c = softmax_c(score_c / tau),   score_c = the closed-set readout's score of c

(the 4-tensor model's summed slot log-likelihood, the flat baseline's teacher-forced log-likelihood, as
`world_model.evaluation.model_forecasts` scores them; tau = 1 is what a rollout reports without a calibration file,
`world_model.models.explanations`). The simulator
knows the exact distribution p of sentence t given its full state at the end of second t - 1 (the episode record's
"next"), so every metric is an expectation over that distribution, not over the one sentence that happened:

- ECE: windows are put in `BINS` equal-width bins by the confidence max_c q_c; per bin, |mean confidence - mean
  p(chosen)| weighted by the bin's share of windows (p(chosen) is the exact probability that the chosen sentence is
  right, so no sampling noise enters).
- Brier: E_{y~p} sum_c (q_c - [y = c])^2 = 1 - 2 q.p + |q|^2 (sum_c p_c in place of 1 when p has mass outside
  the known set); its floor, reached by q = p, is 1 - |p|^2.
- Log-loss: E_{y~p} -log q_y, the cross-entropy of q against p; its floor is the entropy of p (the exact ceiling).
  A sentence outside the known set gets q = 0; its mass is reported, and q is floored at `FLOOR` for the log.

Both floors condition on the simulator's full state (heights, the called floor), which the sentences do not show,
so a perfect sentence-only predictor sits above them where that state matters.

If tau = 1 is badly calibrated, the standard fix is one temperature: `--train` episodes (another seed) choose the tau
that minimises the log-loss on them, and the held-out metrics are reported at tau = 1 and at that tau.

    python -m world_model.evaluation.calibration --checkpoint offline_pack/predictor --heldout DATA/heldout \
        --train DATA/train --out results/calibration
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from world_model.data.synthetic.episodes import episode_sentences, read_episodes, sentence_windows
from world_model.models.checkpoint import CheckpointError
from world_model.models.decoding import CALIBRATION_NAME
from world_model.models.registry import load_predictor
from world_model.text.vocab import UnknownWordError, Vocabulary
from world_model.utils.cli import check_output, check_range
from world_model.utils.eval_mode import eval_mode
from world_model.utils.files import replacing_file, write_json_atomic, write_text_atomic
from world_model.utils.flags import settings_main

BINS = 15  # reliability bins of equal width over [0, 1]
FLOOR = 1e-12  # the least probability the log-loss takes a log of
TEMPERATURES = torch.logspace(-1, 3, 401)  # searched on the training episodes (0.1 to 1000)


def true_distributions(
    records: Sequence[dict], index_of: Callable[[str], int | None], candidates: int
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The exact next-sentence distributions of every window over the `candidates` known sentences (`index_of`
    gives a sentence's row, None outside the set): (S, C) probabilities, the (S,) mass outside the known set, and
    each window's scene; windows in the order of `sentence_windows`."""
    rows, outside, scenes = [], [], []
    for record in records:
        for t in range(1, len(record["sentences"])):
            row = torch.zeros(candidates, dtype=torch.float64)
            missing = 0.0
            for text, p in record["next"][t - 1]["distribution"]:
                c = index_of(text)
                if c is None:
                    missing += p
                else:
                    row[c] += p
            rows.append(row)
            outside.append(missing)
            scenes.append(record["scene"])
    return torch.stack(rows), torch.tensor(outside, dtype=torch.float64), scenes


@torch.no_grad()
def candidate_scores(model, vocab: Vocabulary, records: Sequence[dict], candidates: torch.Tensor, batch: int = 512):
    """The closed-set readout's score (S, C) of every known sentence for every window of `records` (the 4-tensor
    model's or the flat baseline's, as `world_model.evaluation.model_forecasts.candidate_scores` gives them)."""
    from world_model.evaluation.model_forecasts import candidate_scores as closed_set_scores  # it imports this module

    c = model.config
    windows = sentence_windows([episode_sentences(r) for r in records], vocab, c.n_states, c.n_tokens)[:, :-1]
    scores = []
    with eval_mode(model):
        for start in range(0, len(windows), batch):
            scores.append(closed_set_scores(model, windows[start : start + batch], candidates))
    return torch.cat(scores).double()


def metrics(scores: torch.Tensor, truth: torch.Tensor, outside: torch.Tensor, temperature: float = 1.0) -> dict:
    """ECE, Brier and log-loss (module docstring) of softmax(scores / temperature) (S, C) against the exact
    distributions truth (S, C) (+ outside (S,) mass off the known set), with their floors and the reliability bins."""
    q = (scores / temperature).softmax(dim=1)
    confidence, chosen = q.max(dim=1)
    correct = truth.gather(1, chosen[:, None])[:, 0]  # exact probability that the chosen sentence is right
    known = truth.sum(1)  # 1 - outside
    brier = known - 2 * (q * truth).sum(1) + (q * q).sum(1)
    log_loss = -(truth * q.clamp_min(FLOOR).log()).sum(1) - outside * math.log(FLOOR)
    entropy = -(truth * truth.clamp_min(1e-300).log()).sum(1)  # the outside mass is not a known sentence: excluded
    bins = reliability(confidence, correct)
    return {
        "temperature": temperature,
        "windows": len(q),
        "ece": sum(b["windows"] * abs(b["confidence"] - b["accuracy"]) for b in bins) / len(q),
        "mean_confidence": float(confidence.mean()),
        "accuracy": float(correct.mean()),
        "brier": float(brier.mean()),
        "brier_floor": float((known - (truth * truth).sum(1)).mean()),
        "log_loss": float(log_loss.mean()),
        "log_loss_floor": float(entropy.mean()),
        "bins": bins,
    }


def reliability(confidence: torch.Tensor, correct: torch.Tensor) -> list[dict]:
    """The `BINS` equal-width confidence bins that hold windows: their range, count, mean confidence and mean exact
    probability of being right."""
    which = (confidence * BINS).long().clamp(max=BINS - 1)
    bins = []
    for b in range(BINS):
        inside = which == b
        if inside.any():
            bins.append(
                {
                    "low": b / BINS,
                    "high": (b + 1) / BINS,
                    "windows": int(inside.sum()),
                    "confidence": float(confidence[inside].mean()),
                    "accuracy": float(correct[inside].mean()),
                }
            )
    return bins


def fit_temperature(scores: torch.Tensor, truth: torch.Tensor, outside: torch.Tensor) -> float:
    """The temperature of `TEMPERATURES` with the least log-loss against the exact distributions."""
    losses = [metrics(scores, truth, outside, float(t))["log_loss"] for t in TEMPERATURES]
    return float(TEMPERATURES[min(range(len(losses)), key=losses.__getitem__)])


def calibrate(
    checkpoint: str | Path, heldout: str | Path, train: str | Path | None = None, episodes: int | None = None
) -> dict:
    """The held-out metrics at temperature 1, overall and per scene, and, given training episodes, the temperature
    fitted on them and the held-out metrics at it; with `episodes`, only the last that many of each split."""
    model, vocab, candidates = load_predictor(checkpoint)
    if candidates is None:
        raise CheckpointError(f"{checkpoint} has no known_sentences.txt: calibration scores its closed set")
    rows = {tuple(ids): c for c, ids in enumerate(candidates.tolist())}

    def index_of(sentence: str) -> int | None:
        try:
            return rows.get(tuple(vocab.encode(sentence, model.config.n_tokens, strict=True)))
        except UnknownWordError:
            return None

    def evaluate(split: str | Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
        records = read_episodes(split)[-episodes:] if episodes else read_episodes(split)
        truth, outside, scenes = true_distributions(records, index_of, len(candidates))
        return candidate_scores(model, vocab, records, candidates), truth, outside, scenes

    scores, truth, outside, scenes = evaluate(heldout)
    result = {
        "checkpoint": str(checkpoint),
        "heldout": str(heldout),
        "heldout_made_by": generator_command(heldout),
        "episodes": episodes,
        "known_sentences": len(candidates),
        "mass_outside_known": float(outside.mean()),
        "at_1": metrics(scores, truth, outside),
        "per_scene_at_1": per_scene(scores, truth, outside, scenes, 1.0),
    }
    if train is not None:
        temperature = fit_temperature(*evaluate(train)[:3])
        result.update(
            train=str(train),
            train_made_by=generator_command(train),
            fitted_temperature=temperature,
            at_fitted=metrics(scores, truth, outside, temperature),
            per_scene_at_fitted=per_scene(scores, truth, outside, scenes, temperature),
        )
    return result


def generator_command(split: str | Path) -> str | None:
    """The command that wrote a split folder, from its summary.json (None when it has none)."""
    path = Path(split) / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return (
        "python -m world_model.data.synthetic.generator generate "
        f"--split {summary['split']} --episodes {summary['episodes']} --seed {summary['base_seed']} --out DIR "
        f"--size {summary['size'][0]}"
    )


def per_scene(scores, truth, outside, scenes: list[str], temperature: float) -> dict:
    """`metrics` without the bins, for each scene's windows."""
    out = {}
    for scene in sorted(set(scenes)):
        rows = torch.tensor([s == scene for s in scenes])
        entry = metrics(scores[rows], truth[rows], outside[rows], temperature)
        out[scene] = {k: v for k, v in entry.items() if k != "bins"}
    return out


def markdown(result: dict, command: str) -> str:
    """The result as a Markdown report."""
    columns = [("at_1", "per_scene_at_1", "1")]
    if "at_fitted" in result:
        columns.append(("at_fitted", "per_scene_at_fitted", f"{result['fitted_temperature']:.3g} (fitted)"))
    lines = [
        "# Calibration of the next-state probabilities on held-out synthetic episodes",
        "",
        f"Command: `{command}`",
        "",
        f"Checkpoint `{result['checkpoint']}` ({result['known_sentences']} known sentences); held-out episodes "
        f"`{result['heldout']}`, {result['at_1']['windows']} windows (every second t >= 1). Metrics are expectations "
        "under the simulator's exact next-sentence distribution (`world_model/evaluation/calibration.py`); floors are "
        "those of the exact distribution itself. Mass of the true distributions on sentences outside the known set: "
        f"{result['mass_outside_known']:.4f}.",
        "",
        f"Held-out episodes: `{result['heldout_made_by']}`"
        + (f"; training episodes: `{result['train_made_by']}`." if "train" in result else "."),
        "",
        "| temperature | windows | ECE | mean confidence | accuracy (exact) | Brier | Brier floor | log-loss | "
        "log-loss floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, scene_key, label in columns:
        rows = [("all", result[key])] + list(result[scene_key].items())
        lines += [
            f"| {label}, {name} | {m['windows']} | {m['ece']:.4f} | {m['mean_confidence']:.4f} | {m['accuracy']:.4f} "
            f"| {m['brier']:.4f} | {m['brier_floor']:.4f} | {m['log_loss']:.4f} | {m['log_loss_floor']:.4f} |"
            for name, m in rows
        ]
    if "at_fitted" in result:
        lines += ["", f"Temperature fitted on the training episodes `{result['train']}` (least log-loss)."]
    lines += ["", "![reliability](reliability.png)", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """The reliability diagram: mean exact accuracy against mean confidence per bin, for each temperature."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5, 5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    runs = [("at_1", "temperature 1", "tab:red")]
    if "at_fitted" in result:
        runs.append(("at_fitted", f"temperature {result['fitted_temperature']:.3g} (fitted)", "tab:blue"))
    for key, label, color in runs:
        bins = result[key]["bins"]
        sizes = [20 + 200 * b["windows"] / result[key]["windows"] for b in bins]
        axes.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], color=color, linewidth=1)
        axes.scatter(
            [b["confidence"] for b in bins], [b["accuracy"] for b in bins], s=sizes, color=color,
            label=f"{label}: ECE {result[key]['ece']:.3f}",
        )  # fmt: skip
    axes.set(
        xlim=(0, 1), ylim=(0, 1), xlabel="confidence (probability of the chosen sentence)",
        ylabel="exact probability that it is right", title="Reliability, held-out synthetic episodes",
    )  # fmt: skip
    axes.legend(loc="upper left", fontsize=8)
    with replacing_file(Path(path)) as staged:
        figure.savefig(staged, dpi=120, bbox_inches="tight")


@dataclass
class CalibrationSettings:
    """Which checkpoint is calibrated on which episodes, and where the report goes."""

    checkpoint: str = field(metadata={"help": "predictor folder with known_sentences.txt"})
    heldout: str = field(metadata={"help": "held-out split folder (episodes.jsonl) to report on"})
    out: Path = field(metadata={"help": "folder for results.json, results.md, reliability.png"})
    train: str | None = field(
        default=None, metadata={"help": "training split folder (another seed) to fit a temperature on"}
    )
    episodes: int | None = field(
        default=None,
        metadata={
            "help": "only the last N episodes of each split (of a training split, its last tenth is the validation "
            "slice training held out)"
        },
    )
    save: bool = field(
        default=False,
        metadata={
            "help": f"write the fitted temperature to the checkpoint's {CALIBRATION_NAME}, which rollouts then report "
            "with"
        },
    )

    def __post_init__(self) -> None:
        if self.save and not self.train:
            raise ValueError("--save needs --train: the temperature is fitted on training episodes")
        check_range("--episodes", self.episodes, 1)


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        CalibrationSettings,
        "world_model.evaluation.calibration",
        __doc__.split("\n\n")[0],
        calibration_command,
        argv,
    )


def calibration_command(settings: CalibrationSettings, command: str) -> None:
    """The command's work: check --out, fit and measure, write the report (and the temperature with --save), print
    the table."""
    inputs = {"checkpoint": settings.checkpoint, "held-out split": settings.heldout, "training split": settings.train}
    check_output(settings.out, "--out", inputs, overwrite=True)  # a report folder: its three files are replaced
    result = calibrate(settings.checkpoint, settings.heldout, settings.train, settings.episodes)
    write_json_atomic(settings.out / "results.json", {"command": command, **result})
    write_text_atomic(settings.out / "results.md", markdown(result, command))
    plot(result, settings.out / "reliability.png")
    if settings.save:
        saved = {"temperature": result["fitted_temperature"], "fitted_on": result["train"], "command": command}
        write_json_atomic(Path(settings.checkpoint) / CALIBRATION_NAME, saved)
    print(markdown(result, command))


if __name__ == "__main__":
    sys.exit(main())
