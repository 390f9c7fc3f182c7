"""The world report as a person reads it: results.md (the memory table, the targets, a table per scene) and
accuracy.png (accuracy against seconds ahead, a panel per scene)."""

from __future__ import annotations

from pathlib import Path

from world_model.evaluation.world_scores import ALL

MEMORY_WORDS = {True: "yes", False: "no", None: ""}
PAIR = ("four_tensor", "flat_baseline")  # the predictors compared seed by seed


def value(metric: float | dict | None) -> float | None:
    """A metric's number: itself, or the mean of a ``{"mean", "lo", "hi"}``."""
    return metric["mean"] if isinstance(metric, dict) else metric


def markdown(result: dict, command: str) -> str:
    """The report: the memory table, the targets, then one table per scene (rows: ceilings, entropy, forecasters;
    columns: k)."""
    lines = ["# The synthetic world: ceilings, floors and predictors", "", f"Command: `{command}`", ""]
    return "\n".join(lines + forecast_lines(result, level=2) + ["", "![accuracy by scene and step](accuracy.png)", ""])


def forecast_lines(result: dict, level: int) -> list[str]:
    """The report's forecasting part as lines: what is measured, the memory table, the targets, and one table per
    scene under headings of ``level``."""
    steps = len(result["scenes"][ALL]["k"])
    head = "| | " + " | ".join(f"k={k}" for k in range(1, steps + 1)) + " |\n|---|" + "---:|" * steps
    lines = [
        f"{result['points']} prediction points (every cut of every held-out episode), floors counted on "
        f"{result['train_episodes']} training episodes. Accuracy is exact sentence match k seconds ahead, with a 95% "
        "interval (over seeds for a predictor trained with several, else over the held-out episodes); log-loss in nats "
        "a sentence. *From sentences*: the best a predictor that reads only the observed sentences can do (entropy: "
        "the log-loss it pays); *full state*: what the simulator's whole state allows.",
        *temperature_note(result["settings"].get("temperatures", {})),
        "",
        "| scene | episodes | points | ceiling from sentences, k=1 | Markov-2, k=1 | gap | needs memory |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for group, entry in result["scenes"].items():
        one = entry["k"]["1"]
        gap = one["ceiling_from_sentences"] - one["predictors"]["markov2"]["accuracy"]
        lines.append(
            f"| {group} | {entry['episodes']} | {entry['points']} | {one['ceiling_from_sentences']:.3f} | "
            f"{one['predictors']['markov2']['accuracy']:.3f} | {gap:+.3f} | {MEMORY_WORDS[entry['needs_memory']]} |"
        )
    lines += [
        "",
        f"Averaged over the scenes and k = 1..{steps}:",
        "",
        "| forecaster | accuracy / ceiling from sentences | log-loss minus entropy (nats) |",
        "|---|---:|---:|",
    ]
    for name, t in result["targets"].items():
        excess = "" if t["log_loss_minus_entropy"] is None else f"{t['log_loss_minus_entropy']:+.3f}"
        lines.append(f"| {name} | {t['fraction_of_ceiling']:.3f} | {excess} |")
    for group, entry in result["scenes"].items():
        ks = [entry["k"][str(k)] for k in range(1, steps + 1)]
        lines += ["", f"{'#' * level} {group}", "", head]
        for key, label in (
            ("ceiling_full_state", "ceiling, full state"),
            ("ceiling_from_sentences", "ceiling, from sentences"),
            ("entropy_from_sentences", "entropy, from sentences (nats)"),
        ):
            lines.append(f"| {label} | " + " | ".join(f"{r[key]:.3f}" for r in ks) + " |")
        for name in ks[0]["predictors"]:
            lines.append(f"| {name} | " + " | ".join(cell(r["predictors"][name]) for r in ks) + " |")
        paired = f"{PAIR[0]}_minus_{PAIR[1]}"
        if paired in ks[0]:
            lines.append(f"| {paired.replace('_', ' ')} | " + " | ".join(difference(r[paired]) for r in ks) + " |")
    return lines


def temperature_note(temperatures: dict[str, list[float]]) -> list[str]:
    """A line naming each predictor's confidence temperatures (its folders' calibration.json, 1 without one)."""
    if not temperatures:
        return []
    named = "; ".join(f"{name} {', '.join(f'{t:.3g}' for t in taus)}" for name, taus in temperatures.items())
    return ["", f"Predictors' distributions are softmax(score / temperature), the temperature of each seed: {named}."]


def cell(p: dict) -> str:
    """A forecaster's accuracy with its interval, and its log-loss."""
    accuracy = value(p["accuracy"])
    if isinstance(p["accuracy"], dict) and p["accuracy"]["lo"] is not None:
        lo, hi = p["accuracy"]["lo"], p["accuracy"]["hi"]
    else:
        lo, hi = p["accuracy_ci95"] or (accuracy, accuracy)
    loss = value(p["log_loss"])
    return f"{accuracy:.3f} [{lo:.3f}, {hi:.3f}]" + ("" if loss is None else f", {loss:.3f} nats")


def difference(d: dict) -> str:
    """A paired difference's accuracy and log-loss with their intervals."""
    a, loss = d["accuracy"], d["log_loss"]
    interval = lambda m: "" if m["lo"] is None else f" [{m['lo']:+.3f}, {m['hi']:+.3f}]"  # noqa: E731
    return f"{a['mean']:+.3f}{interval(a)}, {loss['mean']:+.3f}{interval(loss)} nats"


def plot(result: dict, path: Path) -> None:
    """One panel per scene: accuracy against k for the ceilings and every forecaster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(result["scenes"])
    columns = 4
    rows = (len(groups) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows), sharey=True, squeeze=False)
    for ax, group in zip(axes.flat, groups):
        entry = result["scenes"][group]["k"]
        ks = sorted(entry, key=int)
        x = [int(k) for k in ks]
        ax.plot(x, [entry[k]["ceiling_full_state"] for k in ks], "k:", label="ceiling, full state")
        ax.plot(x, [entry[k]["ceiling_from_sentences"] for k in ks], "k-", lw=2, label="ceiling, from sentences")
        for name in entry[ks[0]]["predictors"]:
            floor = name == "copy_last" or name.startswith("markov")
            ys = [value(entry[k]["predictors"][name]["accuracy"]) for k in ks]
            ax.plot(x, ys, marker="o", ms=3, lw=1 if floor else 2.2, ls="--" if floor else "-", label=name)
        ax.set(title=group, xticks=x, ylim=(0, 1.02), xlabel="seconds ahead")
    for ax in axes.flat[len(groups) :]:
        ax.axis("off")
    axes[0, 0].set_ylabel("accuracy")
    axes.flat[0].legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
