"""How a pretrained model is judged on its corpus: the held-out loss (mean next-token negative log-likelihood, in
nats) and its perplexity, and how well likelihood tells reads of the corpus' own sources from sources it never
saw (the area under the ROC curve, METAGENE-1's out-of-distribution detection).

Rows are ``[rows, seq_len]`` token ids padded at the end with ``pad_id`` (:mod:`shared.pretraining.corpus`); a
position's loss is taken on the token after it unless that token is padding.
"""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel
from transformers import PreTrainedModel

EVAL_BATCH = 32


class Evaluation(BaseModel):
    """A model's figures on a corpus' evaluation shards."""

    held_out_loss: float
    """Mean next-token loss on the held-out documents, in nats a token."""
    perplexity: float
    """``exp(held_out_loss)``."""
    ood_auroc: float | None
    """Probability that a held-out document scores a higher mean log-likelihood than one of the held-out sources:
    0.5 is chance, 1 a perfect detector. None without an out-of-distribution shard."""


def token_log_likelihoods(model: PreTrainedModel, rows: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the summed log-probability of its predicted tokens and how many there are (``[rows]`` each)."""
    sums, counts = [], []
    with torch.no_grad():
        for start in range(0, rows.shape[0], EVAL_BATCH):
            ids = rows[start : start + EVAL_BATCH].long()  # [batch, seq]
            logits = model(input_ids=ids, attention_mask=(ids != pad_id).long()).logits[:, :-1].float()  # [batch, seq-1, vocab]
            targets = ids[:, 1:]  # [batch, seq-1]
            log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            predicted = targets != pad_id
            sums.append((log_probs * predicted).sum(dim=1))
            counts.append(predicted.sum(dim=1))
    return torch.cat(sums), torch.cat(counts)


def auroc(positives: list[float], negatives: list[float]) -> float:
    """Probability that a random positive scores above a random negative, ties counting half (Mann-Whitney U)."""
    if not positives or not negatives:
        raise ValueError("an AUROC needs at least one positive and one negative score")
    ranked = sorted([(s, 1) for s in positives] + [(s, 0) for s in negatives])
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        mean_rank = (i + 1 + j) / 2  # ranks i+1..j share their mean
        rank_sum += mean_rank * sum(label for _, label in ranked[i:j])
        i = j
    n_pos, n_neg = len(positives), len(negatives)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def evaluate(model: PreTrainedModel, held_out: torch.Tensor, out_of_distribution: torch.Tensor | None, pad_id: int) -> Evaluation:
    """The model's :class:`Evaluation` on a corpus' held-out (and out-of-distribution) rows. A document's score is
    its log-likelihood a predicted token, whatever its length."""
    model.eval()
    sums, counts = token_log_likelihoods(model, held_out, pad_id)
    loss = -float(sums.sum()) / max(1, int(counts.sum()))
    ood = None
    if out_of_distribution is not None:
        other_sums, other_counts = token_log_likelihoods(model, out_of_distribution, pad_id)
        ood = auroc((sums / counts.clamp(min=1)).tolist(), (other_sums / other_counts.clamp(min=1)).tolist())
    return Evaluation(held_out_loss=loss, perplexity=math.exp(loss), ood_auroc=ood)
