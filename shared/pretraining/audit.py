"""Replaying one of a pretraining island's outer steps: the check an audit of an island makes (issue #47).

With :attr:`~shared.pretraining.settings.PretrainSettings.fresh_inner`, an outer step is a function of what the run
publishes: the agreed weights it started from (the policy step the meeting began at), the slots it reported in the
order it learnt them (each shard's rows in its epoch's order), and the run's settings. :func:`replay` takes those
inner steps again and returns the pseudo-gradient an honest island would have sent; :func:`judge` compares it with
what the island did send, judged on the vector itself, never on anything the island says about it.

:mod:`validator.island_audits` runs it on the outer steps a run draws for audit (:mod:`coordinator.services.island_audits`).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel
from transformers import PreTrainedModel

from intellect_protocol.shared.pretraining.learning import learn_shard, optimizer_for
from intellect_protocol.shared.pretraining.settings import TOLERANCE, PretrainSettings


class Verdict(BaseModel):
    """How far what an island sent is from its replayed outer step."""

    relative_error: float
    """``|sent - replayed| / |replayed|``."""
    cosine: float
    """Cosine between the two: below 0, the island stepped against what its shards teach."""
    passed: bool


def replay(
    model: PreTrainedModel, slots: list[tuple[int, torch.Tensor]], pad_id: int, settings: PretrainSettings
) -> torch.Tensor:
    """The pseudo-gradient (``[parameters]``, fp32: the starting weights minus the learnt ones) of learning ``slots``,
    each an epoch and its shard's rows (``[rows, seq_len]``), in order, from ``model``'s weights with a fresh inner
    AdamW. ``model`` is left as it was."""
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = optimizer_for(model, settings)
    for epoch, rows in slots:
        learn_shard(model, optimizer, rows, pad_id, settings, epoch)
    with torch.no_grad():
        pseudo = torch.cat([(a - p).flatten() for a, p in zip(start, model.parameters(), strict=True)])
        for p, a in zip(model.parameters(), start, strict=True):
            p.copy_(a)
    return pseudo


def judge(sent: torch.Tensor, replayed: torch.Tensor, tolerance: float = TOLERANCE) -> Verdict:
    """Whether ``sent`` (as the island sent it, any dtype) is the replayed pseudo-gradient within ``tolerance``."""
    sent, replayed = sent.float().flatten(), replayed.float().flatten()
    if sent.shape != replayed.shape or not bool(torch.isfinite(sent).all()):
        return Verdict(relative_error=float("inf"), cosine=0.0, passed=False)
    scale = float(replayed.norm().clamp_min(1e-12))
    error = float((sent - replayed).norm()) / scale
    cosine = float(sent @ replayed) / (float(sent.norm().clamp_min(1e-12)) * scale)
    return Verdict(relative_error=error, cosine=cosine, passed=error <= tolerance)
