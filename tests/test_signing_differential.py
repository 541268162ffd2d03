"""Our EIP-191 recovery (coincurve, on every signed request's path) against eth-account's, the
reference: the same address for every signature, and a refusal wherever the reference refuses."""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_account.messages import encode_defunct
from hypothesis import given, settings
from hypothesis import strategies as st

from intellect_protocol.shared.signing import recover_text_signer, sign_text

pytestmark = pytest.mark.unit

N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
"""The order of secp256k1."""

keys = st.integers(min_value=1, max_value=N - 1).map(lambda k: Account.from_key(k.to_bytes(32, "big")))
texts = st.text(max_size=300)


def _reference(text: str, signature: bytes) -> str | None:
    try:
        return Account.recover_message(encode_defunct(text=text), signature=signature)
    except Exception:
        return None


def _ours(text: str, signature: bytes) -> str | None:
    try:
        return recover_text_signer(text, "0x" + signature.hex())
    except ValueError:
        return None


@settings(max_examples=150, deadline=None)
@given(keys, texts)
def test_an_honest_signature_recovers_its_signer_in_both(account, text: str) -> None:
    signature = bytes.fromhex(sign_text(account, text)[2:])
    assert _ours(text, signature) == _reference(text, signature) == account.address


@settings(max_examples=150, deadline=None)
@given(keys, texts)
def test_the_high_s_twin_of_a_signature_is_judged_alike(account, text: str) -> None:
    raw = bytes.fromhex(sign_text(account, text)[2:])
    r, s, v = raw[:32], int.from_bytes(raw[32:64], "big"), raw[64]
    twin = r + (N - s).to_bytes(32, "big") + bytes([55 - v])  # s -> n - s flips the recovery id (27 <-> 28)
    assert _ours(text, twin) == _reference(text, twin)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=65, max_size=65), texts)
def test_arbitrary_bytes_are_refused_or_recovered_alike(signature: bytes, text: str) -> None:
    ours = _ours(text, signature)
    assert ours == _reference(text, signature) or (ours is None and signature[64] not in (0, 1, 27, 28))


@settings(max_examples=100, deadline=None)
@given(keys, texts, st.integers(min_value=0, max_value=64), st.sampled_from([0, 1, 27, 28, 29, 35, 255]))
def test_edited_signatures_never_recover_the_signer_in_one_and_not_the_other(account, text, flip, v) -> None:
    raw = bytearray(bytes.fromhex(sign_text(account, text)[2:]))
    raw[flip % 64] ^= 0x01
    raw[64] = v
    ours, reference = _ours(text, bytes(raw)), _reference(text, bytes(raw))
    assert ours == reference or (ours is None and v not in (0, 1, 27, 28))


@pytest.mark.parametrize("signature", ["", "0x", "0x" + "00" * 65, "0x" + "zz" * 65, "0x" + "11" * 64, "11" * 65])
def test_malformed_signatures_are_refused(signature: str) -> None:
    with pytest.raises(ValueError):
        recover_text_signer("hello", signature)
