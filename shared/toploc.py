"""TOPLOC proofs of inference, byte-compatible with the reference format (``toploc`` 0.1.6).

For each chunk of :data:`CHUNK` committed positions, the chunk's bf16 hidden states are
flattened row after row, the :data:`TOPK` entries largest in absolute value are picked
(``torch.topk``, so ties break as the reference breaks them), and the polynomial through
the points (flat index mod m, bf16 bit pattern) is interpolated over GF(:data:`PRIME`),
where m is the largest modulus <= PRIME under which the chunk's indices stay distinct. A chunk's proof is m as a big-endian u16 followed by the polynomial's monomial
coefficients c0..c127 as big-endian u16: 258 bytes. A chunk with fewer than TOPK values
(a tiny model's last chunk) commits to all of them.

A verifier recomputes the hidden states, takes its own top-k, evaluates the proof at those
indices and compares the bf16 exponents and mantissas it gets with its own.

Everything is vectorised over chunks (numpy for the field arithmetic, torch for top-k);
GF(65497) is small enough that modular inverses come from one precomputed table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
from pydantic import BaseModel, Field

from intellect_protocol.shared.cpu_ledger import spent

PRIME = 65497
TOPK = 128
CHUNK = 32
MODULUS_BLOCK = 64


class ToplocThresholds(BaseModel):
    """When a chunk's proof counts as failed; a rollout fails when any chunk does."""

    exp_mismatches_max: int = Field(38, ge=0)
    """Most top-k entries whose bf16 exponent may differ from the proof's."""
    mant_err_mean_max: float = Field(10.0, ge=0)
    """Largest mean absolute mantissa difference over entries whose exponents agree."""
    mant_err_median_max: float = Field(8.0, ge=0)
    """Largest median absolute mantissa difference over entries whose exponents agree."""


@dataclass(frozen=True)
class ChunkResult:
    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    ok: bool
    reason: str | None = None


class ProofFormatError(ValueError):
    """Proof bytes that do not parse; the message says why."""


@cache
def _inverses() -> np.ndarray:
    """inv[a] = a^-1 mod PRIME for a in 1..PRIME-1 (inv[0] unused)."""
    a = np.arange(PRIME, dtype=np.int64)
    result, base, exponent = np.ones(PRIME, dtype=np.int64), a.copy(), PRIME - 2
    while exponent:
        if exponent & 1:
            result = result * base % PRIME
        base = base * base % PRIME
        exponent >>= 1
    return result


def chunk_sizes(positions: int) -> list[int]:
    """Committed positions per chunk for a sequence of ``positions`` fed tokens."""
    return [min(CHUNK, positions - start) for start in range(0, positions, CHUNK)]


def _chunks(hidden: torch.Tensor) -> list[torch.Tensor]:
    """The flat bf16 chunks of one sequence's committed states ``[positions, hidden_size]``."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden states must be [positions, hidden_size], got shape {tuple(hidden.shape)}")
    bf16 = hidden.detach().to("cpu", torch.bfloat16).contiguous()
    # torch splits an empty tensor into one empty piece; no positions means no chunks (as chunk_sizes says).
    return [chunk.reshape(-1) for chunk in bf16.split(CHUNK)] if bf16.shape[0] else []


def _top_entries(chunks: list[torch.Tensor]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per chunk: (flat indices, bf16 bit patterns) of its top-k entries by absolute value.

    Chunks of equal length go through one batched ``topk`` (one row each), the same per-row
    selection a one-dimensional ``topk`` over each chunk makes.
    """
    out: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0), np.empty(0))] * len(chunks)
    by_length: dict[int, list[int]] = {}
    for i, chunk in enumerate(chunks):
        by_length.setdefault(chunk.numel(), []).append(i)
    for length, members in by_length.items():
        rows = torch.stack([chunks[i] for i in members])
        indices = rows.abs().topk(min(TOPK, length), dim=1).indices
        bits = rows.gather(1, indices).view(torch.int16).numpy().astype(np.int64) & 0xFFFF
        for i, idx, b in zip(members, indices.numpy().astype(np.int64), bits):
            out[i] = (idx, b)
    return out


def _injective_moduli(indices: np.ndarray) -> np.ndarray:
    """For each row of ``indices`` [chunks, k], the largest modulus keeping the row distinct."""
    chunks, k = indices.shape
    found = np.zeros(chunks, dtype=np.int64)
    # Most rows are told apart by PRIME itself (always, when every index is below it): try it alone first.
    distinct = (np.diff(np.sort(indices % PRIME, axis=1), axis=1) != 0).all(axis=1)
    found[distinct] = PRIME
    pending = np.flatnonzero(~distinct)
    for top in range(PRIME - 1, k - 1, -MODULUS_BLOCK):  # below k no modulus can keep k values apart
        if pending.size == 0:
            return found
        moduli = np.arange(top, max(top - MODULUS_BLOCK, k - 1), -1, dtype=np.int64)
        residues = np.sort(indices[pending, None, :] % moduli[None, :, None], axis=2)  # [pending, moduli, k]
        block_distinct = (np.diff(residues, axis=2) != 0).all(axis=2)
        hit = block_distinct.any(axis=1)
        found[pending[hit]] = moduli[block_distinct[hit].argmax(axis=1)]
        pending = pending[~hit]
    if pending.size:
        raise ValueError("no modulus <= PRIME keeps these indices distinct")
    return found


def _interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Monomial coefficients [chunks, k] of the polynomials through (x, y) over GF(PRIME).

    Newton divided differences, then expansion into the monomial basis; the interpolating
    polynomial is unique, so these are the reference's coefficients whatever the point order.
    """
    # uint32 holds any product of two residues (65496^2 < 2^32), so the field stays in 32-bit lanes.
    p = np.uint32(PRIME)
    inv = _inverses().astype(np.uint32)
    x = x.astype(np.uint32)
    k = x.shape[1]
    dd = (y % PRIME).astype(np.uint32)
    for level in range(1, k):
        numer = (dd[:, level:] + p - dd[:, level - 1 : -1]) % p
        denom = (x[:, level:] + p - x[:, :-level]) % p
        dd[:, level:] = numer * inv[denom] % p
    neg_x = (p - x) % p
    coeffs = np.zeros_like(dd)
    factor = np.zeros_like(dd)
    factor[:, 0] = 1  # the running product (t - x0)(t - x1)...(t - x_{i-1}), degree i
    for i in range(k):
        coeffs[:, : i + 1] = (coeffs[:, : i + 1] + dd[:, i : i + 1] * factor[:, : i + 1] % p) % p
        if i + 1 < k:
            # factor *= (t - x_i): new[j] = old[j-1] - x_i * old[j], for j = 0..i+1
            shifted = (factor[:, : i + 1] + neg_x[:, i : i + 1] * factor[:, 1 : i + 2] % p) % p
            factor[:, 0] = neg_x[:, i] * factor[:, 0] % p
            factor[:, 1 : i + 2] = shifted
    return coeffs.astype(np.int64)


def _evaluate(coeffs: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Horner's rule, row-wise: coeffs [chunks, k], points t [chunks, n] -> [chunks, n]."""
    result = np.repeat(coeffs[:, -1:], t.shape[1], axis=1)
    for j in range(coeffs.shape[1] - 2, -1, -1):
        result = (result * t + coeffs[:, j : j + 1]) % PRIME
    return result


def build_proofs(hidden: torch.Tensor) -> bytes:
    """Proof bytes for the committed positions' hidden states ``[positions, hidden_size]``."""
    return build_proofs_batch([hidden])[0]


@spent("proof building")
def build_proofs_batch(hiddens: list[torch.Tensor]) -> list[bytes]:
    """:func:`build_proofs` for many sequences at once: all their chunks share each array op."""
    entries = _top_entries([chunk for hidden in hiddens for chunk in _chunks(hidden)])
    encoded: list[bytes] = [b""] * len(entries)
    for k in sorted({len(idx) for idx, _ in entries}):
        rows = [i for i, (idx, _) in enumerate(entries) if len(idx) == k]
        indices = np.stack([entries[i][0] for i in rows])
        moduli = _injective_moduli(indices)
        coeffs = _interpolate(indices % moduli[:, None], np.stack([entries[i][1] for i in rows]))
        for row, modulus, c in zip(rows, moduli, coeffs):
            encoded[row] = int(modulus).to_bytes(2, "big") + c.astype(">u2").tobytes()
    out, start = [], 0
    for hidden in hiddens:
        count = len(chunk_sizes(hidden.shape[0]))
        out.append(b"".join(encoded[start : start + count]))
        start += count
    return out


def parse_proofs(proofs: bytes, sizes: list[tuple[int, int]]) -> list[tuple[int, np.ndarray]]:
    """Strictly split untrusted proof bytes into (modulus, coefficients) per chunk.

    ``sizes`` gives each chunk's (positions, k) as the verifier expects them.
    """
    expected = sum(2 + 2 * k for _, k in sizes)
    if len(proofs) != expected:
        raise ProofFormatError(f"proofs are {len(proofs)} bytes, expected {expected} for {len(sizes)} chunks")
    parsed = []
    offset = 0
    for chunk, (_, k) in enumerate(sizes):
        modulus = int.from_bytes(proofs[offset : offset + 2], "big")
        coeffs = np.frombuffer(proofs, dtype=">u2", count=k, offset=offset + 2).astype(np.int64)
        offset += 2 + 2 * k
        if not 1 <= modulus <= PRIME:
            raise ProofFormatError(f"chunk {chunk}: modulus {modulus} outside 1..{PRIME}")
        if (coeffs >= PRIME).any():
            raise ProofFormatError(f"chunk {chunk}: a coefficient is >= {PRIME}")
        parsed.append((modulus, coeffs))
    return parsed


def verify_proofs(hidden: torch.Tensor, proofs: bytes, thresholds: ToplocThresholds | None = None) -> list[ChunkResult]:
    """One result per chunk of ``hidden`` [positions, hidden_size]; never raises on bad bytes."""
    return verify_proofs_batch([hidden], [proofs], thresholds)[0]


@spent("proof checking")
def verify_proofs_batch(
    hiddens: list[torch.Tensor], proofs: list[bytes], thresholds: ToplocThresholds | None = None
) -> list[list[ChunkResult]]:
    """:func:`verify_proofs` for many sequences at once: every chunk of every sequence shares each
    array op (top-k, evaluation, comparison), as :func:`build_proofs_batch` builds them."""
    thresholds = thresholds or ToplocThresholds()
    per_row = [_chunks(hidden) for hidden in hiddens]
    entries = _top_entries([chunk for chunks in per_row for chunk in chunks])
    results: list[list[ChunkResult]] = []
    checked: list[tuple[int, int, np.ndarray, np.ndarray, int, np.ndarray]] = []
    """(row, chunk, top-k indices, their bits, the proof's modulus, its coefficients)."""
    start = 0
    for row, (chunks, proof) in enumerate(zip(per_row, proofs, strict=True)):
        mine = entries[start : start + len(chunks)]
        start += len(chunks)
        try:
            parsed = parse_proofs(proof, [(0, len(idx)) for idx, _ in mine])
        except ProofFormatError as e:
            results.append([ChunkResult(TOPK, float("inf"), float("inf"), False, f"malformed proof: {e}") for _ in mine])
            continue
        results.append([ChunkResult(0, 0.0, 0.0, False)] * len(mine))  # each replaced below
        checked += [(row, n, idx, bits, m, c) for n, ((idx, bits), (m, c)) in enumerate(zip(mine, parsed))]
    for k in sorted({len(entry[2]) for entry in checked}):
        group = [entry for entry in checked if len(entry[2]) == k]
        indices, bits = np.stack([e[2] for e in group]), np.stack([e[3] for e in group])
        moduli, coeffs = np.array([e[4] for e in group], dtype=np.int64), np.stack([e[5] for e in group])
        claimed = _evaluate(coeffs, indices % moduli[:, None]) & 0xFFFF
        for (row, n, *_), chunk in zip(group, _judge(claimed, bits, thresholds)):
            results[row][n] = chunk
    return results


def _judge(claimed: np.ndarray, bits: np.ndarray, thresholds: ToplocThresholds) -> list[ChunkResult]:
    """Each chunk's verdict from the bf16 patterns the proof claims and the verifier's own, both
    ``[chunks, k]``: exponents must agree, and where they do, mantissas must be close."""
    exp_mismatch = ((claimed >> 7) & 0xFF) != ((bits >> 7) & 0xFF)
    mant_err = np.abs((claimed & 0x7F) - (bits & 0x7F))
    mismatches = exp_mismatch.sum(axis=1)
    agree = claimed.shape[1] - mismatches
    # Entries whose exponents differ sort last, so a row's first ``agree`` values are the ones compared.
    compared = np.sort(np.where(exp_mismatch, np.iinfo(np.int64).max, mant_err), axis=1)
    sums = np.where(exp_mismatch, 0, mant_err).sum(axis=1)
    out = []
    for row in range(len(claimed)):
        n = int(agree[row])
        mean = float(sums[row] / n) if n else float(2**64)
        # The reference's median: element n // 2 of the sorted values, the upper of the middle two when n is even.
        median = float(compared[row, n // 2]) if n else float(2**64)
        failed = []
        if mismatches[row] > thresholds.exp_mismatches_max:
            failed.append(f"{int(mismatches[row])} exponent mismatches > {thresholds.exp_mismatches_max}")
        if mean > thresholds.mant_err_mean_max:
            failed.append(f"mantissa error mean {mean:.2f} > {thresholds.mant_err_mean_max}")
        if median > thresholds.mant_err_median_max:
            failed.append(f"mantissa error median {median:.2f} > {thresholds.mant_err_median_max}")
        out.append(ChunkResult(int(mismatches[row]), mean, median, not failed, "; ".join(failed) or None))
    return out


def rollout_passes(results: list[ChunkResult]) -> bool:
    """A rollout passes only when every one of its chunks does."""
    return all(r.ok for r in results)
