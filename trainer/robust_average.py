"""The outer step's arithmetic, the same on every island of a meeting (:mod:`trainer.islands` says why): the robust
average of what every island sent, judged on the vectors themselves, and DiLoCo's outer optimizer."""

from __future__ import annotations

import math

import torch

from intellect_protocol.shared.island_schemas import OuterSettings


def pairwise_dots(sent: torch.Tensor) -> torch.Tensor:
    """Every pair's dot product, ``[participants, participants]`` from ``sent [participants, size]``; its diagonal
    holds each one's squared norm. Under FSDP each rank's are summed into the whole island's."""
    return sent @ sent.T


def robust_average(
    sent: torch.Tensor, norms: list[float], ratio: float, dots: torch.Tensor | None = None, screen: bool = False
) -> tuple[torch.Tensor | None, list[int], dict[int, str]]:
    """The outer step's pseudo-gradient from every participant's ``sent [participants, size]`` (fp32, a shard
    under FSDP), their whole measured ``norms`` and ``dots`` (:func:`pairwise_dots`, whole; by default those of
    ``sent``), with directions screened if ``screen``: (the average, or None if no one is sound; who it includes,
    by index; who is left out, and why). See the module docstring."""
    dots = pairwise_dots(sent) if dots is None else dots
    excluded = {i: "its pseudo-gradient is not finite" for i, n in enumerate(norms) if not math.isfinite(n)}
    sound = sorted((n, i) for i, n in enumerate(norms) if math.isfinite(n) and n > 0)
    if sound:
        upper = sound[len(sound) // 2][0]
        for n, i in sound:
            if n > ratio * upper:
                excluded[i] = f"its pseudo-gradient's norm {n:.3g} is {n / upper:.0f}x the median {upper:.3g}"
        sound = [(n, i) for n, i in sound if i not in excluded]
    if not sound:
        return None, [], excluded
    bound = sound[(len(sound) - 1) // 2][0]
    kept = sorted(i for _, i in sound)
    if screen and len(kept) >= 3:
        against = against_the_rest(kept, dots, norms)
        excluded |= against
        kept = [i for i in kept if i not in against]
    clipped = torch.stack([sent[i] * min(1.0, bound / norms[i]) for i in kept])
    if len(clipped) < 3:
        return clipped.mean(0), kept, excluded
    ordered = clipped.sort(dim=0).values
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return median, kept, excluded


def against_the_rest(kept: list[int], dots: torch.Tensor, norms: list[float]) -> dict[int, str]:
    """Of the sound participants ``kept``, those whose pseudo-gradient points against every other one's (a
    negative cosine with each), and why: left out only when the rest are a majority whose pseudo-gradients all
    point the same way as one another's. Otherwise none: honest islands that disagree among themselves give no
    direction to screen by, and the coordinate-wise median bounds a liar then."""

    def cosine(i: int, j: int) -> float:
        return float(dots[i, j]) / (norms[i] * norms[j])

    against = [i for i in kept if all(cosine(i, j) < 0 for j in kept if j != i)]
    rest = [i for i in kept if i not in against]
    if not against or 2 * len(rest) <= len(kept) or any(cosine(i, j) <= 0 for i in rest for j in rest if i < j):
        return {}
    return {
        i: f"its pseudo-gradient points against every other island's (cosine {max(cosine(i, j) for j in rest):.2f} at most)"
        for i in against
    }


def outer_optimizer(agreed: list[torch.Tensor], settings: OuterSettings) -> torch.optim.SGD:
    """DiLoCo's outer Nesterov SGD on the agreed weights; without momentum, plain SGD (at lr 1: averaging)."""
    momentum = settings.outer_momentum
    return torch.optim.SGD(agreed, lr=settings.outer_lr, momentum=momentum, nesterov=momentum > 0)
