"""Cross-check against the reference ``toploc`` 0.1.6 package, when it could be built here.

``.ci/run`` builds it from source against our torch (``--no-build-isolation``); nothing of
ours imports it outside this test.
"""

from __future__ import annotations

import pytest
import torch

from intellect_protocol.shared.toploc import build_proofs, chunk_sizes, rollout_passes, verify_proofs
from tests.test_toploc import split_error_chunk

pytestmark = pytest.mark.unit

reference = pytest.importorskip("toploc.poly", reason="the reference toploc package could not be built here")


def _as_reference_activations(hidden: torch.Tensor) -> list[torch.Tensor]:
    # With skip_prefill=True the reference chunks a list of per-position states by 32.
    return list(hidden)


@pytest.mark.parametrize("positions,width", [(32, 256), (70, 256), (100, 1024), (40, 4096)])
def test_same_bytes_and_mutual_verification(positions: int, width: int) -> None:
    hidden = torch.randn(positions, width, generator=torch.Generator().manual_seed(positions)).to(torch.bfloat16)
    ours = build_proofs(hidden)
    theirs = reference.build_proofs_bytes(_as_reference_activations(hidden), decode_batching_size=32, topk=128, skip_prefill=True)
    assert len(theirs) == len(chunk_sizes(positions))
    assert ours == b"".join(theirs)

    # The reference verifier accepts our proofs against slightly perturbed activations, and
    # computes the same statistics as ours.
    noisy = (hidden.float() + 0.003 * torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    chunked = [ours[i * 258 : (i + 1) * 258] for i in range(len(theirs))]
    their_results = reference.verify_proofs_bytes(
        _as_reference_activations(noisy), chunked, decode_batching_size=32, topk=128, skip_prefill=True
    )
    our_results = verify_proofs(noisy, ours)
    assert rollout_passes(our_results)
    for a, b in zip(our_results, their_results, strict=True):
        assert a.exp_mismatches == b.exp_mismatches
        assert a.mant_err_mean == pytest.approx(b.mant_err_mean)
        assert a.mant_err_median == pytest.approx(b.mant_err_median)


def test_an_even_split_of_errors_is_judged_as_the_native_reference_judges_it() -> None:
    """The reference has two verifiers: its native one (``poly.cpp``, given a tensor) takes the
    upper-middle mantissa error as the median; its Python fallback (given a list) averages the
    middle two, accepting what the native one rejects. We match the native one."""
    hidden, perturbed = split_error_chunk()
    proofs = build_proofs(hidden)
    [native] = reference.verify_proofs_bytes(perturbed, [proofs], decode_batching_size=32, topk=128, skip_prefill=True)
    [ours] = verify_proofs(perturbed, proofs)
    assert (ours.exp_mismatches, ours.mant_err_mean, ours.mant_err_median) == (
        native.exp_mismatches,
        native.mant_err_mean,
        native.mant_err_median,
    )
    assert ours.mant_err_median == 9.0 and not ours.ok
    [fallback] = reference.verify_proofs_bytes(list(perturbed), [proofs], decode_batching_size=32, topk=128, skip_prefill=True)
    assert fallback.mant_err_median == 8.0  # the averaging median, which would pass this chunk
