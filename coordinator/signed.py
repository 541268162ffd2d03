"""What a verified signed request tells the coordinator."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SignedRequest:
    address: str
    nonce: str
    timestamp: int
