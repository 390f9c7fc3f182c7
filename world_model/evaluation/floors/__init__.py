"""Count floors for L_S(4): predictors of S(4)'s tokens that learn nothing a network would need to learn.

Four floors, each a distribution over the ids of the vocabulary but padding (padding is never a target; the unknown
id is an ordinary outcome, as it is for the models' softmax), weakest first:

    unigram                 token counts over every sentence of the training windows, add-alpha smoothed
    position_unigram        one such distribution per token slot n (counts at slot n of all five sentences)
    position_unigram_copy   (1 - w) position_unigram + w copy, copy(v) = the share of v among the
                            non-padding tokens of the window's four context sentences S(0..3)
    cooccurrence_copy       the position unigram rescaled by what the context's words have been seen to precede
                            in the training stories (trigger counts), mixed with copy (`cooccurrence`)

Every setting (alpha, copy weight, the co-occurrence floor's strength and exponent) is chosen on a held-out slice of
the training windows and the floors refitted on them all (`selection`); nothing from validation is read. L_S(4) is
the mean cross-entropy (nats) over the non-padding tokens of S(4), as the models report it; token accuracy is the
argmax match rate on the same tokens.

Modules: `counts` (slot counts, the table floors, copying, metrics), `cooccurrence` (the co-occurrence floor),
`priors` (the end cost a free-running writer pays, and the count priors label smoothing trains towards),
`selection` (choosing, refitting and measuring the floors; the last-sentence floor, a reference for the baseline).
"""

from world_model.evaluation.floors.cooccurrence import (
    BETAS,
    STRENGTHS,
    CooccurrenceFloor,
    cooccurrence_counts,
    select_cooccurrence,
)
from world_model.evaluation.floors.counts import (
    ALPHAS,
    CONTEXT,
    COPY_WEIGHTS,
    HELDOUT_FRACTION,
    TABLE_FLOORS,
    CountFloor,
    best_alpha,
    best_copy_weight,
    check_windows,
    context_copy,
    floor_metrics,
    slot_counts,
    split_heldout,
)
from world_model.evaluation.floors.priors import count_copy_prior, count_end_cost, count_prior, sentence_end_counts
from world_model.evaluation.floors.selection import (
    FLOORS,
    floor_report,
    floor_settings,
    last_sentence_floor,
    select_floors,
)

__all__ = [
    "ALPHAS",
    "BETAS",
    "CONTEXT",
    "COPY_WEIGHTS",
    "FLOORS",
    "HELDOUT_FRACTION",
    "STRENGTHS",
    "TABLE_FLOORS",
    "CooccurrenceFloor",
    "CountFloor",
    "best_alpha",
    "best_copy_weight",
    "check_windows",
    "context_copy",
    "cooccurrence_counts",
    "count_copy_prior",
    "count_end_cost",
    "count_prior",
    "floor_metrics",
    "floor_report",
    "floor_settings",
    "last_sentence_floor",
    "select_cooccurrence",
    "select_floors",
    "sentence_end_counts",
    "slot_counts",
    "split_heldout",
]
