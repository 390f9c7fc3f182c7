"""The printed report of `python -m world_model.evaluation.evaluate`: the metrics, the floors beside the model,
Story Cloze and the coherence measures of every scorer (`world_model.evaluation.evaluate.evaluate_checkpoint`'s
result)."""

from __future__ import annotations

from world_model.evaluation.floors import FLOORS, floor_settings

DUAL_ENCODER = "bag_of_words_dual_encoder"  # the coherence floor's name in reports
WITH_HEAD = "model + coherence head"  # the model scored with its folder's coherence head


def print_result(result: dict) -> None:
    """The metrics, then the floors beside the model and the Story Cloze accuracies."""
    for key, value in result.items():
        if not isinstance(value, dict) and value is not None:
            print(f"{key}: {value:.6f}" if isinstance(value, float) else f"{key}: {value}")
    floors = result["floors"]
    if floors is None:
        print("floors: none (no training file ROCStories*.csv in the data folder, or --floors none)")
    else:
        sel = floors["selection"]
        print(
            f"floors on the same validation tokens (fitted on {floors['train_windows']} training windows; settings chosen on the "
            f"last {sel['heldout_windows']} of them, held out):"
        )
        for name in FLOORS:
            f = floors[name]
            print(
                f"  {name:<22} L_S(4) {f['val_last_ce']:.4f}  token accuracy {f['val_token_accuracy']:.4f}  "
                f"({floor_settings(f)})"
            )
        print(f"  {'model':<22} L_S(4) {result['val_last_ce']:.4f}  token accuracy {result['val_token_accuracy']:.4f}")
        print(
            f"  a writer that must also say where S(4) ends, as the free-running baseline does, pays on top: "
            f"{floors['end_cost']:.4f} knowing only the training sentences' per-slot end rate"
            + (f", {result['val_last_end_cost']:.4f} for this model" if "val_last_end_cost" in result else "")
        )
        print(
            f"  the position unigram counted on the training S(4) slots alone (the tokens the flat baseline is trained "
            f"on): L_S(4) {floors['last_sentence']['val_last_ce']:.4f} (alpha {floors['last_sentence']['alpha']:g})"
        )
    print("Story Cloze accuracy (right ending by S(4) log-likelihood; summed / per token):")
    for name, halves in result["story_cloze"].items():
        if name != "references":
            print(
                f"  {name:<22} "
                + "  ".join(
                    f"{half} {h['summed']:.3f} / {h['per_token']:.3f} ({h['stories']} stories)"
                    for half, h in halves.items()
                )
            )
    print("  published: " + ", ".join(f"{k} {v:.3f}" for k, v in result["story_cloze"]["references"].items()))
    print_coherence(result["coherence"])


def print_coherence(reports: dict) -> None:
    """Story Cloze (test half, the rule chosen on the val half, val beside it) and retrieval of every scorer."""
    candidates = next(iter(reports.values()))["retrieval"]["candidates"]
    print(
        "Coherence: Story Cloze on the test half with the decision rule chosen on the val half (val beside it); "
        f"the right ending ranked among {candidates} candidates (its wrong ending and {candidates - 2} right endings "
        "of other cloze stories):"
    )
    print(f"  {'scorer':<26} {'rule':<16} {'test':>6} {'val':>6} {'R@1':>6} {'R@10':>6} {'MRR':>6}")
    for name, r in reports.items():
        if name != "references":
            rule = {DUAL_ENCODER: "similarity", WITH_HEAD: "head score"}.get(name, r["rule"])
            q = r["retrieval"]
            print(
                f"  {name:<26} {rule:<16} {r.get('test', float('nan')):>6.3f} {r['val']:>6.3f} "
                f"{q['recall_at_1']:>6.3f} {q['recall_at_10']:>6.3f} {q['mrr']:>6.3f}"
            )
    print("  published (test half): " + ", ".join(f"{k} {v:.3f}" for k, v in reports["references"].items()))
