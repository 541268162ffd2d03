"""Pretraining's inner step, shared by everyone who takes it: the single-process trainer (:mod:`trainer.pretrain`),
islands (:mod:`trainer.pretrain_island`) and validators replaying an island's outer step (:mod:`shared.pretraining.audit`).

An inner step is next-token loss on ``batch_rows`` rows of one shard (AdamW, gradients clipped), the rows of a
shard in an order drawn from the seed and the epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from transformers import PreTrainedModel

from intellect_protocol.shared.pretraining.settings import PretrainSettings


def next_token_loss(model: PreTrainedModel, ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mean loss on every token of ``ids`` (``[batch, seq]``) after the first that is not padding."""
    labels = ids.masked_fill(ids == pad_id, -100)
    loss: torch.Tensor = model(input_ids=ids, attention_mask=(ids != pad_id).long(), labels=labels).loss
    return loss


def row_order(rows: int, seed: int, epoch: int) -> torch.Tensor:
    """The order a shard's ``rows`` are learnt in during ``epoch``: drawn from ``seed`` and the epoch, so each
    epoch reads a shard's rows in another order and anyone can replay it."""
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def batches(rows: torch.Tensor, settings: PretrainSettings, epoch: int) -> Iterator[torch.Tensor]:
    """A shard's rows (``[rows, seq_len]``), ``batch_rows`` at a time (``[batch, seq_len]``), in ``epoch``'s order
    (:func:`row_order`)."""
    order = row_order(rows.shape[0], settings.seed, epoch)
    for start in range(0, rows.shape[0], settings.batch_rows):
        yield rows[order[start : start + settings.batch_rows]].long()


def inner_step(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, ids: torch.Tensor, pad_id: int, settings: PretrainSettings
) -> tuple[float, int]:
    """One optimizer step on ``ids`` (``[batch, seq]``); its loss and the tokens it learnt from."""
    model.train()
    loss = next_token_loss(model, ids, pad_id)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
    optimizer.step()
    return float(loss.detach()), int((ids != pad_id).sum())


def learn_shard(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    rows: torch.Tensor,
    pad_id: int,
    settings: PretrainSettings,
    epoch: int,
    after_step: Callable[[float, int], None] | None = None,
) -> int:
    """Inner steps over every row of one shard in ``epoch``'s order; the tokens learnt from. ``after_step`` gets each
    step's loss and tokens."""
    learnt = 0
    for ids in batches(rows, settings, epoch):
        loss, tokens = inner_step(model, optimizer, ids, pad_id, settings)
        learnt += tokens
        if after_step is not None:
            after_step(loss, tokens)
    return learnt


def optimizer_for(model: torch.nn.Module, settings: PretrainSettings) -> torch.optim.AdamW:
    """A fresh inner AdamW (its state empty) over ``model``'s parameters."""
    return torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
