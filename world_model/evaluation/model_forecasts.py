"""A predictor's forecasts k seconds ahead over a synthetic world's known sentences.

At a window of past sentences, a predictor with known sentences (C of them) gives each a score: the 4-tensor model
the summed per-slot log-probability of its tokens off the last slice, the flat baseline its teacher-forced
log-likelihood (``world_model.models.decoding``, the closed-set readout a rollout uses). ``softmax(score / tau)`` is
its distribution of the next sentence (``tau`` the folder's confidence temperature, 1 without one). The baseline's
scores leave out the candidates whose first tokens are ``PRUNE`` times less likely than the best (a trie over those
tokens, ``pruned_sentence_scores``): the same scores for every candidate it keeps, in a fraction of the time.

Its distribution k sentences ahead is the marginal of that one-step distribution pushed forward: every history the
predictor continues with probability at least ``EXPAND_MIN`` is followed, and the ``BEAM`` likeliest histories of
each point are kept after each step (renormalised), as ``world_model.evaluation.floors.markov`` does for the count
floors. The forecast at each k is that marginal's likeliest sentence, its probability, and the probability of the
truth, so accuracy, log-loss and calibration are read off the same distribution as the ceilings'. Histories
recur (the cut after a second reads what the cut before it followed with the true sentence; episodes share
pasts), so each distinct window is scored once a call.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from world_model.evaluation.world_scores import Forecast, Point
from world_model.models.baseline_generation import gold_log_probs
from world_model.models.decoding import slot_log_likelihood
from world_model.text.vocab import PAD_ID, Vocabulary
from world_model.text.windows import decode_states
from world_model.utils.eval_mode import eval_mode

EXPAND_MIN = 1e-3
BEAM = 16
PRUNE = 1e-3  # the flat baseline's candidates are followed while their prefix is this likely, relative to the best
TRIE_DEPTH = 3  # ... over their first tokens; the candidates left are then scored whole
CHUNK_ROWS = 512


@torch.no_grad()
def candidate_scores(model: nn.Module, windows: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Each candidate's closed-set score as the next sentence: windows (B, T, N), candidates (C, N) -> (B, C);
    -inf for a baseline candidate pruned below ``PRUNE`` (``pruned_sentence_scores``)."""
    if model.scores_sentences:  # the flat baseline: teacher-forced log-likelihood
        return pruned_sentence_scores(model, windows, candidates)
    logits = model.readout_logits(model.last_slice_logits(windows))  # the 4-tensor model's last slice
    return slot_log_likelihood(logits.log_softmax(dim=-1), candidates, PAD_ID)


@torch.no_grad()
def pruned_sentence_scores(model: nn.Module, windows: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """The flat baseline's teacher-forced log-likelihood of each candidate (``score_sentences``), with the candidates
    that cannot matter left out. The first ``TRIE_DEPTH`` tokens of the candidates' spans are walked as a trie (a
    prefix shared by many candidates runs through the model once), and a prefix less likely than ``PRUNE`` times the
    likeliest prefix of the same length after the same window is not followed: its candidates score -inf
    (probability 0). The candidates left are then scored to their end in one pass. Windows (B, T, N), candidates
    (C, N) -> (B, C)."""
    prefix, prefix_len = model.pack_prefix(windows)
    gold, gold_len = model.pack_target(candidates.to(windows.device))  # (C, G): ids then [EOS]
    spans = [tuple(row[:n]) for row, n in zip(gold.tolist(), gold_len.tolist())]
    scores = torch.full((len(windows), len(spans)), float("-inf"))
    margin = -math.log(PRUNE)
    logits, cache = model.prefill(prefix, prefix_len)
    # a trie node: (window, log-probability of the prefix, the candidates that share it); node i is cache row i
    nodes = [(b, 0.0, list(range(len(spans)))) for b in range(len(windows))]
    for depth in range(TRIE_DEPTH):
        log_p = logits.float().log_softmax(dim=-1).cpu()
        grown = []  # (window, parent row, log-probability, candidates, token)
        for row, (b, so_far, members) in enumerate(nodes):
            branches: dict[int, list[int]] = {}
            for c in members:
                branches.setdefault(spans[c][depth], []).append(c)
            for token, group in branches.items():
                p = so_far + float(log_p[row, token])
                scores[b, [c for c in group if len(spans[c]) == depth + 1]] = p
                going = [c for c in group if len(spans[c]) > depth + 1]
                if going:
                    grown.append((b, row, p, going, token))
        best: dict[int, float] = {}
        for b, _, p, _, _ in grown:
            best[b] = max(best.get(b, p), p)
        grown = [node for node in grown if node[2] >= best[node[0]] - margin]
        if not grown:
            return scores.to(windows.device)
        cache = cache.select(torch.tensor([row for _, row, _, _, _ in grown]))
        logits = model.extend(cache, torch.tensor([token for *_, token in grown]))
        nodes = [(b, p, going) for b, _, p, going, _ in grown]
    # every candidate left, from token TRIE_DEPTH to its [EOS], in one causal pass per chunk of rows
    log_p = logits.float().log_softmax(dim=-1)
    rows = [(i, c) for i, (_, _, members) in enumerate(nodes) for c in members]
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        rest = [spans[c][TRIE_DEPTH:] for _, c in chunk]
        width = max(len(r) for r in rest)
        padded = torch.tensor([r + (r[-1],) * (width - len(r)) for r in rest])  # (R, width), repeats never scored
        node_rows = torch.tensor([i for i, _ in chunk])
        first = log_p[node_rows, padded[:, 0]]  # (R,) the first remaining token, off the trie's logits
        states = model.extend_hidden(cache.select(node_rows), padded[:, :-1])  # (R, width - 1, d)
        live = torch.arange(1, width)[None, :] < torch.tensor([len(r) for r in rest])[:, None]  # (R, width - 1)
        picked = gold_log_probs(states[live], padded[:, 1:][live], model.E.weight)
        owner = torch.arange(len(chunk))[:, None].expand_as(live)[live]
        total = first.new_zeros(len(chunk)).index_add(0, owner, picked.float()) + first
        for (i, c), value in zip(chunk, total.tolist()):
            scores[nodes[i][0], c] = nodes[i][1] + value
    return scores.to(windows.device)


def known_sentences(candidates: torch.Tensor, vocab: Vocabulary) -> list[str]:
    """The sentences of the candidate rows (C, N), in row order."""
    return decode_states(candidates, vocab)


@torch.no_grad()
def k_step_forecasts(
    model: nn.Module,
    vocab: Vocabulary,
    candidates: torch.Tensor,
    points: Sequence[Point],
    steps: int,
    contexts: Sequence[Sequence[str]] | None = None,
    temperature: float = 1.0,
    batch_size: int = 256,
    progress: bool = False,
) -> list[Forecast]:
    """The predictor's forecasts at every point, k = 1..steps, from each point's observed sentences (or from
    ``contexts``, e.g. their captions, one list per point)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    contexts = [p.observed for p in points] if contexts is None else contexts
    if len(contexts) != len(points):
        raise ValueError(f"{len(points)} points but {len(contexts)} contexts")
    c = model.config
    device = next(model.parameters()).device
    candidates = candidates.to(device).long()
    known = known_sentences(candidates.cpu(), vocab)
    index = {s: i for i, s in enumerate(known)}
    pasts = [vocab.encode_batch(list(ctx)[-c.n_states :], c.n_tokens) for ctx in contexts]  # (L, N) each
    marginals = torch.zeros(len(points), steps, len(known), dtype=torch.float64)
    frontier: list[list[tuple[float, list[int]]]] = [[(1.0, [])] for _ in points]  # per point: (p, candidate rows)
    seen: dict[bytes, torch.Tensor] = {}  # a window's next-sentence distribution, computed once for the whole call
    with eval_mode(model), tqdm(total=steps, desc="forecasting", unit="step", disable=not progress) as bar:
        for k in range(steps):
            rows = [(i, p, history) for i, entries in enumerate(frontier) for p, history in entries]
            windows = [_window(pasts[i], candidates, history, c.n_states) for i, _, history in rows]
            keys = [w.numpy().tobytes() for w in windows]
            new = list({key: w for key, w in zip(keys, windows) if key not in seen}.items())
            for start in range(0, len(new), batch_size):
                chunk = new[start : start + batch_size]
                scores = candidate_scores(model, torch.stack([w for _, w in chunk]).to(device), candidates)
                for (key, _), q in zip(chunk, (scores.double() / temperature).softmax(dim=-1).cpu()):
                    seen[key] = q
            probs = [seen[key] for key in keys]
            grown: list[dict[tuple[int, ...], float]] = [{} for _ in points]
            for (i, p, history), q in zip(rows, probs):
                marginals[i, k] += p * q
                for j in torch.nonzero(q >= EXPAND_MIN).flatten().tolist():
                    key = tuple(history) + (j,)
                    grown[i][key] = grown[i].get(key, 0.0) + p * float(q[j])
            frontier = []
            for entries in grown:
                kept = sorted(entries.items(), key=lambda item: -item[1])[:BEAM]
                total = sum(p for _, p in kept) or 1.0
                frontier.append([(p / total, list(history)) for history, p in kept])
            bar.update()
    forecasts = []
    for i, point in enumerate(points):
        best = marginals[i].argmax(dim=-1).tolist()
        forecasts.append(
            Forecast(
                [known[j] for j in best],
                [float(marginals[i, k, j]) for k, j in enumerate(best)],
                [float(marginals[i, k, index[t]]) if t in index else 0.0 for k, t in enumerate(point.future[:steps])],
            )
        )
    return forecasts


def _window(past: torch.Tensor, candidates: torch.Tensor, history: list[int], n_states: int) -> torch.Tensor:
    """The last ``n_states`` of the observed rows (L, N) and the predicted candidate rows, left-padded: (T, N)."""
    rows = torch.cat([past, candidates[history].cpu()]) if history else past
    rows = rows[-n_states:]
    pad = rows.new_full((n_states - len(rows), rows.shape[1]), PAD_ID)
    return torch.cat([pad, rows])
