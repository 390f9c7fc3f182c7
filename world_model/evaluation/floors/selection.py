"""Choosing the floors' settings on held-out training windows, refitting them, and measuring them.

Selection (`select_floors`) reads training windows only: the last HELDOUT_FRACTION of them (in corpus order) are
held out and the floors are fitted on the rest; alpha is the grid value of ALPHAS of lowest held-out L_S(4) (per
floor), the copy weight the value of COPY_WEIGHTS of lowest held-out L_S(4) at the position floor's alpha, and the
co-occurrence floor's strength, exponent and copy weight the grid point of lowest held-out L_S(4) at that alpha too.
The chosen floors are then refitted on all the training windows given.
"""

from __future__ import annotations

import torch

from world_model.evaluation.floors.cooccurrence import select_cooccurrence
from world_model.evaluation.floors.counts import (
    HELDOUT_FRACTION,
    TABLE_FLOORS,
    CountFloor,
    best_alpha,
    best_copy_weight,
    check_windows,
    floor_metrics,
    slot_counts,
    split_heldout,
)
from world_model.evaluation.floors.priors import count_end_cost

FLOORS = (*TABLE_FLOORS, "cooccurrence_copy")  # weakest first


def last_sentence_floor(train_windows: torch.Tensor, val_windows: torch.Tensor, vocab_size: int) -> dict:
    """The position unigram counted on the S(4) slots of the training windows alone: what counting learns from the
    tokens the flat baseline's loss reads (section 7.4: it is trained on S(T) only, a fifth of the sentences the
    floors count). Alpha is chosen on the held-out slice as in `select_floors`, then the floor is refitted on all
    `train_windows` and scored on `val_windows`: {"alpha", "heldout_last_ce", "val_last_ce"}."""
    check_windows(train_windows, vocab_size, "training windows")
    fit, held = split_heldout(train_windows)
    alpha, heldout_ce = best_alpha("position_unigram", slot_counts(fit, vocab_size, last_only=True), held)
    floor = CountFloor.fit("position_unigram", slot_counts(train_windows, vocab_size, last_only=True), alpha)
    return {
        "alpha": alpha,
        "heldout_last_ce": heldout_ce,
        "val_last_ce": floor_metrics(floor, val_windows, accuracy=False)["last_ce"],
    }


def select_floors(train_windows: torch.Tensor, vocab_size: int, fraction: float = HELDOUT_FRACTION) -> dict:
    """Choose every floor's settings on a held-out slice of the training windows, then refit on them all.

    Returns {"floors": {name: CountFloor | CooccurrenceFloor}, "selection": {"fit_windows", "heldout_windows",
    "heldout_fraction", name: {"alpha", "copy_weight", "heldout_last_ce"} (the co-occurrence floor also "strength"
    and "beta")}}. Nothing but `train_windows` is read.
    """
    check_windows(train_windows, vocab_size, "training windows")
    fit, held = split_heldout(train_windows, fraction)
    counts = slot_counts(fit, vocab_size)
    selection: dict = {"fit_windows": len(fit), "heldout_windows": len(held), "heldout_fraction": fraction}
    for name in ("unigram", "position_unigram"):
        alpha, heldout_ce = best_alpha(name, counts, held)
        selection[name] = {"alpha": alpha, "copy_weight": 0.0, "heldout_last_ce": heldout_ce}
    alpha = selection["position_unigram"]["alpha"]
    weight, heldout_ce = best_copy_weight(counts, held, alpha)
    selection["position_unigram_copy"] = {"alpha": alpha, "copy_weight": weight, "heldout_last_ce": heldout_ce}
    all_counts = slot_counts(train_windows, vocab_size)
    floors = {
        name: CountFloor.fit(name, all_counts, selection[name]["alpha"], selection[name]["copy_weight"])
        for name in TABLE_FLOORS
    }
    floors["cooccurrence_copy"], selection["cooccurrence_copy"] = select_cooccurrence(
        fit, held, train_windows, vocab_size, alpha
    )
    return {"floors": floors, "selection": selection}


def floor_settings(entry: dict) -> str:
    """A floor's chosen settings in words, from its report entry: "alpha 0.1, copy 0.2, m 10, beta 1"."""
    text = f"alpha {entry['alpha']:g}"
    if entry["copy_weight"]:
        text += f", copy {entry['copy_weight']:g}"
    if "beta" in entry:
        text += f", m {entry['strength']:g}, beta {entry['beta']:g}"
    return text


def floor_report(train_windows: torch.Tensor, val_windows: torch.Tensor, vocab_size: int) -> tuple[dict, dict]:
    """Select and refit the floors on `train_windows`, then measure them on `val_windows`.

    Returns (floors {name: CountFloor | CooccurrenceFloor}, report {"selection": ..., "train_windows", "end_cost"
    (`count_end_cost`), "last_sentence" (`last_sentence_floor`), name: {the settings of `select_floors`,
    "val_last_ce", "val_token_accuracy", "last_tokens"}}).
    """
    chosen = select_floors(train_windows, vocab_size)
    report = {
        "train_windows": len(train_windows),
        "selection": {k: v for k, v in chosen["selection"].items() if k not in FLOORS},
        "end_cost": count_end_cost(train_windows, val_windows),
        "last_sentence": last_sentence_floor(train_windows, val_windows, vocab_size),
    }
    for name, floor in chosen["floors"].items():
        m = floor_metrics(floor, val_windows)
        report[name] = {
            **chosen["selection"][name],
            "val_last_ce": m["last_ce"],
            "val_token_accuracy": m["token_accuracy"],
            "last_tokens": m["last_tokens"],
        }
    return chosen["floors"], report
