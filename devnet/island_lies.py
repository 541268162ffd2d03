"""Faulty and hostile trainer islands, for the tests and ``bench/islands.py``: each rewrites an island's
weights just before an outer step so the pseudo-gradient it sends (the agreed weights minus its own) is the
one a broken or lying island would send."""

from __future__ import annotations

import torch


def lie(kind: str, model: torch.nn.Module, agreed: list[torch.Tensor]) -> None:
    """Make the island's pseudo-gradient (agreed minus its weights) a faulty or hostile one: not finite
    (``nan``), its weights 1e4x (``huge``), sign-flipped at 1.2x its norm (``flip``), 1e-9x (``tiny``), or
    noise at 200x its norm (``noise``)."""
    with torch.no_grad():
        weights = list(model.parameters())
        if kind in ("nan", "huge"):
            weights[0].mul_(float("nan") if kind == "nan" else 1e4)
            return
        pseudo = [a - w for a, w in zip(agreed, weights)]
        norm = torch.stack([p.pow(2).sum() for p in pseudo]).sum().sqrt()
        noise = [torch.randn_like(p) for p in pseudo]
        noise_norm = torch.stack([n.pow(2).sum() for n in noise]).sum().sqrt()
        for w, a, p, n in zip(weights, agreed, pseudo, noise):
            lied = {"flip": -1.2 * p, "tiny": 1e-9 * p, "noise": 200 * norm * n / noise_norm}[kind]
            w.copy_(a - lied)
