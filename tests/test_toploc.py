"""TOPLOC proofs: the reference byte format, honest and dishonest activations, hostile bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from intellect_protocol.shared.toploc import (
    CHUNK,
    PRIME,
    TOPK,
    build_proofs,
    build_proofs_batch,
    chunk_sizes,
    rollout_passes,
    verify_proofs,
    verify_proofs_batch,
)

pytestmark = pytest.mark.unit

GEN = torch.Generator().manual_seed(1234)


def hidden(positions: int, width: int = 256) -> torch.Tensor:
    return torch.randn(positions, width, generator=GEN).to(torch.bfloat16)


def _bits(x: torch.Tensor) -> np.ndarray:
    return x.view(torch.int16).numpy().astype(np.int64) & 0xFFFF


def test_format_matches_the_reference_definition() -> None:
    h = hidden(CHUNK + 5)
    proofs = build_proofs(h)
    assert chunk_sizes(CHUNK + 5) == [CHUNK, 5]
    assert len(proofs) == 2 * (2 + 2 * TOPK)
    for chunk, rows in enumerate((h[:CHUNK], h[CHUNK:])):
        raw = proofs[chunk * 258 : (chunk + 1) * 258]
        modulus = int.from_bytes(raw[:2], "big")
        coeffs = [int.from_bytes(raw[i : i + 2], "big") for i in range(2, 258, 2)]
        flat = rows.reshape(-1)
        indices = flat.abs().topk(TOPK).indices.tolist()
        # m is the largest modulus <= 65497 keeping the indices distinct.
        assert len({i % modulus for i in indices}) == TOPK
        assert all(len({i % m for i in indices}) < TOPK for m in range(modulus + 1, PRIME + 1))
        # The coefficients (ascending powers) interpolate the bf16 bit patterns.
        for index, bits in zip(indices, _bits(flat[indices])):
            t = index % modulus
            assert sum(c * pow(t, j, PRIME) for j, c in enumerate(coeffs)) % PRIME == bits % PRIME


def test_tiny_chunks_commit_to_every_value() -> None:
    h = hidden(3, width=8)  # 24 values < TOPK
    proofs = build_proofs(h)
    assert len(proofs) == 2 + 2 * 24
    assert rollout_passes(verify_proofs(h, proofs))


def test_round_trip_and_small_noise_pass() -> None:
    h = hidden(100, 512).float()
    proofs = build_proofs(h)
    assert rollout_passes(verify_proofs(h, proofs))
    noisy = h + 0.002 * torch.randn(h.shape, generator=GEN)
    results = verify_proofs(noisy, proofs)
    assert rollout_passes(results), results
    assert len(results) == len(chunk_sizes(100))


def test_a_batch_is_judged_as_each_sequence_alone() -> None:
    honest = hidden(70, 512).float()
    noisy = honest + 0.003 * torch.randn(honest.shape, generator=GEN)
    tampered = torch.cat([hidden(CHUNK), hidden(7)])
    small = hidden(3, width=8)  # chunks of fewer than TOPK values: another k in the same batch
    sequences = [honest, noisy, tampered, small, hidden(0), hidden(40)]
    proofs = [build_proofs(honest), build_proofs(honest), build_proofs(hidden(CHUNK + 7)), build_proofs(small), b"", b"\x01"]
    batched = verify_proofs_batch(sequences, proofs)
    assert batched == [verify_proofs(h, p) for h, p in zip(sequences, proofs)]
    assert [rollout_passes(r) for r in batched] == [True, True, False, True, True, False]
    assert batched[2][0].exp_mismatches > 0 and "malformed proof" in (batched[5][0].reason or "")


def test_other_activations_fail() -> None:
    h = hidden(64)
    proofs = build_proofs(h)
    assert not any(r.ok for r in verify_proofs(hidden(64), proofs))
    shifted = torch.cat([h[1:], hidden(1)])
    assert not any(r.ok for r in verify_proofs(shifted, proofs))
    # One chunk tampered: only that chunk fails, and so does the rollout.
    mixed = torch.cat([h[:CHUNK], hidden(CHUNK)])
    results = verify_proofs(mixed, proofs)
    assert [r.ok for r in results] == [True, False]
    assert not rollout_passes(results)
    assert "exponent mismatches" in results[1].reason


@pytest.mark.parametrize(
    "mangle",
    [
        lambda p: p[:-1],
        lambda p: p + b"\x00",
        lambda p: b"",
        lambda p: b"\x00\x00" + p[2:],  # modulus 0
        lambda p: (65498).to_bytes(2, "big") + p[2:],  # modulus above the prime
        lambda p: p[:2] + b"\xff\xff" + p[4:],  # coefficient >= 65497
        lambda p: bytes(len(p)),
    ],
)
def test_malformed_bytes_are_rejected_cleanly(mangle) -> None:
    h = hidden(40)
    results = verify_proofs(h, mangle(build_proofs(h)))
    assert results and not any(r.ok for r in results)
    assert all(r.reason for r in results)


def test_random_bytes_never_crash() -> None:
    h = hidden(40)
    rng = np.random.default_rng(0)
    for length in (0, 1, 258, 516, 1000):
        for _ in range(5):
            results = verify_proofs(h, rng.integers(0, 256, length, dtype=np.uint8).tobytes())
            assert len(results) == 2 and not rollout_passes(results)


def test_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="positions, hidden_size"):
        build_proofs(torch.zeros(2, 3, 4))


def test_batch_equals_one_by_one() -> None:
    from intellect_protocol.shared.toploc import build_proofs_batch

    hiddens = [hidden(n) for n in (1, 31, 32, 33, 70)] + [hidden(5, width=8)]
    assert build_proofs_batch(hiddens) == [build_proofs(h) for h in hiddens]


def test_modulus_steps_down_past_collisions() -> None:
    from intellect_protocol.shared.toploc import _injective_moduli

    # 65497 ≡ 0 and 65497 + j ≡ j: every modulus from 65496 down to 65371 maps 65497 onto one of 1..126.
    indices = np.array([[0, 65497, *range(1, 127)]], dtype=np.int64)
    assert _injective_moduli(indices).tolist() == [65370]
    assert _injective_moduli(np.arange(128, dtype=np.int64)[None, :] * 3).tolist() == [PRIME]


def test_a_sequence_with_no_committed_positions_has_empty_proofs() -> None:
    """A completion that is one EOS token commits no positions (found killing nodes in bench/chaos.py)."""
    empty = torch.zeros(0, 64)
    assert build_proofs(empty) == b"" and verify_proofs(empty, b"") == []
    some = torch.randn(40, 64)
    assert build_proofs_batch([empty, some, empty]) == [b"", build_proofs(some), b""]


def split_error_chunk() -> tuple[torch.Tensor, torch.Tensor]:
    """A chunk and a perturbed copy whose 128 top entries keep their exponents and differ in
    mantissa by 7 (half of them) and 9 (the other half): mean 8, middle pair (7, 9)."""
    hidden = torch.full((32, 256), 0.01)
    flat = hidden.view(-1)
    positions = torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(3))[:TOPK]
    flat[positions] = 2.0 + torch.arange(TOPK) % 60 / 64  # exponent of 2.0, mantissas 0..59 (room for +9)
    hidden = hidden.to(torch.bfloat16)
    bits = hidden.view(-1).view(torch.int16).clone()
    bits[positions] += torch.where(torch.arange(TOPK) % 2 == 0, 7, 9).to(torch.int16)
    return hidden, bits.view(torch.bfloat16).view(32, 256)


def test_the_median_is_the_reference_upper_middle_element() -> None:
    hidden, perturbed = split_error_chunk()
    [result] = verify_proofs(perturbed, build_proofs(hidden))
    assert result.exp_mismatches == 0 and result.mant_err_mean == 8.0
    assert result.mant_err_median == 9.0 and not result.ok  # np.median would say 8.0 and accept
