"""How well a fitted predictor forecasts its held-out clips, beside floors counted on its training clips.

Every cut of every held-out clip with more than `steps` states is a prediction point (as in the synthetic world's
report, `world_model.evaluation.world_scores`): the predictor reads the states before the cut and forecasts the
next `steps`; accuracy is exact sentence match, log-loss the probability it gives the true state (over the known
sentences; a state it has never seen gets `MIN_PROB`). Floors: copy-last, and Markov-1 and -2 over states counted
on the training clips. Intervals are 95% over held-out clips.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from world_model.evaluation.model_forecasts import k_step_forecasts
from world_model.evaluation.world_scores import (
    ALL,
    copy_last_forecasts,
    fit_markov_floors,
    markov_forecasts,
    prediction_points,
    score,
)

FLOORS = ("copy_last", "markov1", "markov2")
FEW_POINTS = 100  # fewer held-out predictions than this and a figure's interval is too wide to mean much


def fit_report(folder: Path, train: Sequence[dict], heldout: Sequence[dict], steps: int) -> dict:
    """{"points", "heldout_clips_scored", "k": {"1"..: {NAME: {"accuracy", "accuracy_ci95", "log_loss"}}}} for the
    predictor in `folder` and the floors, over the held-out clip records long enough to score."""
    from world_model.models.decoding import load_confidence_temperature
    from world_model.models.registry import load_predictor

    scored = [r for r in heldout if len(r["sentences"]) > steps]
    if not scored:
        return {"points": 0, "heldout_clips_scored": 0, "k": {}}
    points = prediction_points(scored, steps)
    forecasts = {"copy_last": copy_last_forecasts(points, steps)}
    floors = fit_markov_floors(train, orders=(1, 2))
    forecasts.update({name: markov_forecasts(floor, points, steps) for name, floor in floors.items()})
    model, vocab, known = load_predictor(folder)
    temperature = load_confidence_temperature(folder)
    forecasts["four_tensor"] = k_step_forecasts(model, vocab, known, points, steps, temperature=temperature)
    scores = {name: score(points, f, steps)[ALL] for name, f in forecasts.items()}
    table = {
        str(k): {
            name: {key: s[str(k)][key] for key in ("accuracy", "accuracy_ci95", "log_loss")}
            for name, s in scores.items()
        }
        for k in range(1, steps + 1)
    }
    return {"points": len(points), "heldout_clips_scored": len(scored), "k": table}


def warnings_of(report: dict, flagged: int, frames: int, captioner: str) -> list[str]:
    """What a reader of the figures must know: too few held-out predictions, frames the captioner does not know."""
    notes = []
    if report["points"] < FEW_POINTS:
        one = report["k"].get("1", {}).get("four_tensor", {})
        ci = one.get("accuracy_ci95")
        width = f" (the 95% interval of its one-step accuracy is {ci[1] - ci[0]:.2f} wide)" if ci else ""
        notes.append(
            f"only {report['points']} held-out predictions{width}: too few for the figures to mean much; "
            "add clips or raise --val-fraction"
        )
    if flagged:
        notes.append(
            f"{flagged} of {frames} frames lie outside the world {captioner} was trained on (its grounding check): "
            "their captions describe that world, not your clips; fit with a captioner of your footage's world "
            "(--captioner hub)"
        )
    return notes


def markdown_table(report: dict) -> list[str]:
    """The report as Markdown rows: one row per forecaster, one column per k."""
    ks = sorted(report["k"], key=int)
    if not ks:
        return ["No held-out clip has enough states to score."]
    lines = [
        "| forecaster | " + " | ".join(f"k={k}" for k in ks) + " |",
        "|---|" + "---:|" * len(ks),
    ]
    for name in ("four_tensor", *FLOORS):
        cells = []
        for k in ks:
            entry = report["k"][k][name]
            ci = entry["accuracy_ci95"]
            interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
            loss = "" if entry["log_loss"] is None else f", {entry['log_loss']:.2f} nats"
            cells.append(f"{entry['accuracy']:.3f}{interval}{loss}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines
