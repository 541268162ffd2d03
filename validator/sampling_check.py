"""The sampling check on one row: is each token the seeded sampler's draw under the validator's logits, and
each claimed logprob the recomputed one, within what the file's numerics explain (:mod:`validator.checks`
says how the findings are judged). Logits are read a block of positions at a time, never ``[tokens, vocab]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.inference import Prefilled, logits_block_bytes, logits_of, vocab_size
from intellect_protocol.shared.rollout_file import Rollout
from intellect_protocol.shared.sampling import nucleus_mask, sampling_scores, token_logprobs
from intellect_protocol.shared.tolerances import Tolerance


@dataclass(frozen=True)
class RowSampling:
    forged: str | None
    deviations: int
    expected: float
    """Deviations numerics would make in this row on average."""
    logprob_errors: torch.Tensor
    """Claimed minus recomputed logprob per token."""
    outliers: int = 0
    """Tokens beyond the dtype's gap bound (allowed up to ``Tolerance.outliers`` a file)."""


def logprob_shift(errors: torch.Tensor, tolerance: Tolerance, spread: float | None = None) -> str | None:
    """Whether logprob errors are shifted one way beyond what numerics (and chance, at 4 standard errors) explain.
    ``spread`` is the honest error's standard deviation per token, by default these errors' own; one token's
    error has none, and is judged by the per-token bound alone."""
    n = len(errors)
    if spread is None:
        if n < 2:
            return None
        spread = float(errors.std())
    if abs(mean := float(errors.mean())) > tolerance.logprob_bias + 4 * spread / math.sqrt(n):
        return (
            f"logprobs are shifted by {mean:+.3g} nats on average over {n} tokens (numerics explain {tolerance.logprob_bias:g})"
        )
    return None


def shifted_rows(errors: list[torch.Tensor], tolerance: Tolerance) -> dict[int, str]:
    """The rows of one file (by index) whose logprob errors are shifted one way. Each row is judged by the
    larger of its own spread per token and the spread pooled within the file's rows: a row of one or a few
    tokens cannot measure its own (a sample spread of 0 once rejected an honest one-token row), and an
    honest row of uncertain tokens rounds more than the file's near-certain ones (the pooled spread alone
    rejected 16 honest bf16 rows of 1,008 at T = 1.2)."""
    rows = [e for e in errors if len(e)]
    freedom = sum(len(e) for e in rows) - len(rows)
    pooled = math.sqrt(sum(float(((e - e.mean()) ** 2).sum()) for e in rows) / freedom) if freedom > 0 else 0.0
    shifted = {}
    for i, e in enumerate(errors):
        own = float(e.std()) if len(e) > 1 else 0.0
        if len(e) and (own or pooled) and (shift := logprob_shift(e, tolerance, max(own, pooled))):
            shifted[i] = shift
    return shifted


@dataclass(frozen=True)
class PositionScores:
    """Per completion position, what the sampling check needs from the validator's logits."""

    gap: torch.Tensor
    """Best score minus the claimed token's, over the position's logit scale (0: the claimed token is the draw)."""
    runner_up: torch.Tensor
    """Best minus second-best score, over the logit scale: how near a tie the position is."""
    logprob: torch.Tensor
    """The claimed token's logprob under ``logits / T``."""

    def on_host(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gap, runner_up, logprob) in host memory: a GPU's logits make them on the GPU."""
        return self.gap.cpu(), self.runner_up.cpu(), self.logprob.cpu()


def _position_scores(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    temperature: float,
    top_p: float,
    tolerance: Tolerance,
) -> PositionScores:
    """Scores of completion positions, one per row of their ``logits [n, vocab]`` (fp32), each drawn
    with its row's seed at its position in the row."""
    tokens = tokens.to(logits.device)  # the claims are read on the host, the logits made where the model is
    scores = sampling_scores(logits, seeds, positions, temperature, top_p)
    scale = (logits.abs().amax(-1) / (temperature or 1.0)).clamp(min=1e-6)
    top2 = scores.topk(2, dim=-1).values
    claimed = scores.gather(-1, tokens[:, None])[:, 0]
    if top_p < 1:
        # A token just outside the validator's nucleus may be just inside the node's: judge it on
        # its score if the mass ranked above it is within numerics of top_p.
        scaled = logits / (temperature or 1.0)
        probs = scaled.softmax(-1)
        mine = probs.gather(-1, tokens[:, None])
        above = (probs * (probs > mine)).sum(-1)
        near = ~nucleus_mask(scaled, top_p).gather(-1, tokens[:, None])[:, 0] & (above < top_p + tolerance.nucleus_mass)
        unmasked = sampling_scores(logits, seeds, positions, temperature).gather(-1, tokens[:, None])[:, 0]
        claimed = torch.where(near, unmasked, claimed)
    return PositionScores(
        gap=(top2[:, 0] - claimed) / scale,
        runner_up=((top2[:, 0] - top2[:, 1]) / scale).nan_to_num(nan=float("inf")),
        logprob=token_logprobs(logits, tokens, temperature),
    )


def row_scores(
    tokens: list[int],
    seed: int,
    blocks: Iterable[tuple[int, torch.Tensor]],
    temperature: float,
    top_p: float,
    tolerance: Tolerance,
) -> PositionScores:
    """:class:`PositionScores` of a whole row from its ``(first position, logits [n, vocab] fp32)`` blocks."""
    claimed = torch.tensor(tokens)
    # Filled in place: a block's small results kept between its large temporaries would fragment the
    # allocator's heap (a 4,096-token row at a 151,936 vocabulary grew it by 5 GB).
    gap, runner_up, logprob = (torch.empty(len(claimed)) for _ in range(3))
    for first, logits in blocks:
        stop = first + len(logits)
        seeds, positions = torch.full((stop - first,), seed, dtype=torch.int64), torch.arange(first, stop)
        scored = _position_scores(logits, claimed[first:stop], seeds, positions, temperature, top_p, tolerance)
        gap[first:stop], runner_up[first:stop], logprob[first:stop] = scored.on_host()
        del logits, scored
    return PositionScores(gap, runner_up, logprob)


@spent("sampling check")
def rows_scores(
    rows: list[tuple[Rollout, Prefilled]],
    temperature: float,
    top_p: float,
    tolerance: Tolerance,
    max_bytes: int | None = None,
) -> list[PositionScores]:
    """:func:`row_scores` of many prefilled rows at once: their positions are packed into shared blocks of
    at most ``max_bytes`` of logits (by default :func:`logits_block_bytes` of their device), so each block's
    operations run once for all of them."""
    if not rows:
        return []
    lengths = [len(r.completion_tokens) for r, _ in rows]
    claimed = torch.tensor([t for r, _ in rows for t in r.completion_tokens], dtype=torch.int64)
    seeds = torch.cat([torch.full((n,), r.seed, dtype=torch.int64) for (r, _), n in zip(rows, lengths)])
    positions = torch.cat([torch.arange(n) for n in lengths])
    model = rows[0][1].model
    step = max(1, (max_bytes or logits_block_bytes(rows[0][1].states.device)) // (4 * vocab_size(model)))
    gap, runner_up, logprob = (torch.empty(len(claimed)) for _ in range(3))
    first = 0
    for states in _blocks([p.states for _, p in rows], step):
        stop = first + len(states)
        with torch.inference_mode():
            logits = logits_of(model, states)
        scored = _position_scores(
            logits, claimed[first:stop], seeds[first:stop], positions[first:stop], temperature, top_p, tolerance
        )
        gap[first:stop], runner_up[first:stop], logprob[first:stop] = scored.on_host()
        del logits, scored
        first = stop
    return [PositionScores(*parts) for parts in zip(*(t.split(lengths) for t in (gap, runner_up, logprob)))]


def _blocks(parts: list[torch.Tensor], step: int) -> Iterator[torch.Tensor]:
    """The rows of ``parts``, in order, as blocks of ``step`` rows (the last one shorter); a block joins
    the ends and starts of parts, and nothing larger than a block is ever made."""
    block: list[torch.Tensor] = []
    held = 0
    for part in parts:
        while len(part):
            piece, part = part[: step - held], part[step - held :]
            block.append(piece)
            held += len(piece)
            if held == step:
                yield torch.cat(block)
                block, held = [], 0
    if block:
        yield torch.cat(block)


def row_sampling(
    r: Rollout, blocks: Iterable[tuple[int, torch.Tensor]], temperature: float, top_p: float, tolerance: Tolerance
) -> RowSampling:
    """Judge one row's tokens and logprobs against the validator's logits, computed in the node's dtype and read as
    ``(first position, logits [n, vocab] fp32)`` blocks (never ``[tokens, vocab]`` at once). Whether its logprobs
    are shifted one way is judged with the file's other rows (:func:`shifted_rows`)."""
    return judge_row(r, row_scores(r.completion_tokens, r.seed, blocks, temperature, top_p, tolerance), temperature, tolerance)


@spent("sampling check")
def judge_row(r: Rollout, scores: PositionScores, temperature: float, tolerance: Tolerance) -> RowSampling:
    """:func:`row_sampling` from the row's scores, made by :func:`row_scores` or :func:`rows_scores`."""
    gap, runner_up, logprob = scores.gap, scores.runner_up, scores.logprob
    claimed, where = torch.tensor(r.logprobs), torch.arange(len(r.logprobs))
    if r.sampled is not None:  # the environment's tokens were written, not drawn: its replay checked them
        drawn = torch.tensor(r.sampled)
        gap, runner_up, logprob, claimed, where = gap[drawn], runner_up[drawn], logprob[drawn], claimed[drawn], where[drawn]
    beyond = gap > tolerance.max_gap
    if int(beyond.sum()) > tolerance.outliers:
        t = int(beyond.nonzero()[0])
        return RowSampling(
            f"token {int(where[t])} is not the seeded draw ({float(gap[t]):.3g} of the logit scale below it; numerics explain {tolerance.max_gap:g})",
            0,
            0.0,
            torch.zeros(0),
        )

    # Where the logits themselves disagree beyond rounding (an allowed outlier), so may their logprobs.
    recomputed = logprob[~beyond]
    error = claimed[~beyond] - recomputed
    # Logits are divided by T before the softmax: below T = 1 their rounding grows with 1 / T.
    bound = tolerance.logprob_abs / min(1.0, temperature or 1.0) + tolerance.logprob_rel * recomputed.abs()
    if (off := error.abs() > bound).any():
        t = int(off.nonzero()[0])
        return RowSampling(
            f"a logprob is off by {float(error[t]):+.3g} nats (numerics explain {float(bound[t]):.3g})", 0, 0.0, error
        )
    expected = float((torch.exp(-runner_up / tolerance.flip_scale) / 2).sum())
    return RowSampling(None, int((gap > 0).sum()), expected, error, outliers=int(beyond.sum()))
