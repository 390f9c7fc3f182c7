"""What the paper reports (sections 8.1 and 9, Table 5), and the check of the paper preset's parameter totals.

The parameter check builds both models of every pair of the paper preset on the meta device (nothing is allocated)
with the paper's vocabulary and compares their totals with the ones the paper reports (millions, one decimal).
"""

from __future__ import annotations

import torch

from world_model.benchmark.preset import MODELS, load_preset, run_config
from world_model.models.registry import build_model, count_parameters

# Section 8.1 and section 9 of the paper: the vocabulary, and what the text reports for each pair
# (Table 5 as quoted in the text: parameters in millions, L_S(4) and perplexity at the selected checkpoint,
# the lowest L_S(4) over all logged epochs, the minimum validation selection loss).
PAPER_VOCAB_SIZE = 36_711
PAPER_REPORTED = {
    "h2_l2": {
        "parameters_m": {"four_tensor": 122.2, "baseline": 175.9},
        "last_ce": {"four_tensor": 5.562, "baseline": 5.873},
        "perplexity": {"four_tensor": 260, "baseline": 355},
        "lowest_last_ce": {"four_tensor": 5.562, "baseline": 5.845},
        "selection_loss": {"four_tensor": 1.305, "baseline": 5.481},
    },
    "h4_l2": {
        "parameters_m": {"four_tensor": 172.5, "baseline": 175.9},
        "last_ce": {"four_tensor": 5.554, "baseline": 5.701},
        "perplexity": {"four_tensor": 258, "baseline": 299},
        "lowest_last_ce": {"four_tensor": 5.554, "baseline": 5.694},
        "selection_loss": {"four_tensor": 1.305, "baseline": 5.310},
        "hours": {"four_tensor": 2.4, "baseline": 45.2},
    },
    "h4_l3": {
        "parameters_m": {"four_tensor": 256.4, "baseline": 226.2},
        "last_ce": {"four_tensor": 5.531, "baseline": 5.667},
        "perplexity": {"four_tensor": 252, "baseline": 289},
        "lowest_last_ce": {"four_tensor": 5.531, "baseline": 5.667},
        "selection_loss": {"four_tensor": 1.314, "baseline": 5.297},
        "epochs": {"baseline": "29/35"},
    },
}


def meta_parameter_count(model: torch.nn.Module) -> int:
    if not all(p.is_meta for p in model.parameters()):
        raise RuntimeError("the parameter check must build its models on the meta device")
    return count_parameters(model)


def paper_parameter_check(vocab_size: int = PAPER_VOCAB_SIZE) -> list[dict]:
    """Both models of every pair of the paper preset, built on the meta device with the paper's vocabulary,
    against the totals the paper reports (millions, one decimal)."""
    preset = load_preset("paper")
    rows = []
    for pair in preset["pairs"]:
        for model_type in MODELS:
            section = run_config(preset, pair, model_type)["model"]
            with torch.device("meta"):
                model = build_model(section, vocab_size)  # the baseline adds [BOS] and [EOS] itself
            parameters = meta_parameter_count(model)
            reported = PAPER_REPORTED.get(pair, {}).get("parameters_m", {}).get(model_type)
            rows.append(
                {
                    "pair": pair,
                    "model_type": model_type,
                    "n_heads": section["n_heads"],
                    "n_layers": section["n_layers"],
                    "parameters": parameters,
                    "parameters_m": round(parameters / 1e6, 1),
                    "paper_m": reported,
                    "match": reported is not None and round(parameters / 1e6, 1) == reported,
                }
            )
    return rows
