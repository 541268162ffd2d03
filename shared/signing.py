"""Signed requests: one canonical string per HTTP request, signed with EIP-191.

The canonical string binds everything a replayer or tamperer could change::

    intellect-request-v1
    METHOD
    /path
    sorted, re-encoded query string
    sha256 hex of the raw body
    timestamp (integer unix seconds)
    nonce (hex, 16 to 64 characters)
    audience (the coordinator deployment's id)

It is sent as four headers, with two more: the sender's protocol version
(:data:`shared.version.PROTOCOL_VERSION`), which the server checks first, and the sha256 of the body
the signature covers, so that a server can check the signature of a large upload from its headers,
before it reads a byte of the body (and then that the body is the one declared). :class:`SignedAuth` signs every request an ``httpx`` client
makes; :func:`recover_signer` is what a server calls to learn who signed. Checking the
timestamp window, the nonce's freshness and the body's address is the server's job.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Generator
from urllib.parse import parse_qsl, urlencode

import httpx
from coincurve import PublicKey
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_hash.auto import keccak
from eth_utils import to_checksum_address

from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.version import PROTOCOL_HEADER, PROTOCOL_VERSION

SCHEME = "intellect-request-v1"
HEADER_ADDRESS = "x-intellect-address"
HEADER_TIMESTAMP = "x-intellect-timestamp"
HEADER_NONCE = "x-intellect-nonce"
HEADER_SIGNATURE = "x-intellect-signature"
HEADER_BODY_SHA256 = "x-intellect-body-sha256"
NONCE_PATTERN = re.compile(r"[0-9a-f]{16,64}")
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
SIGNATURE_PATTERN = re.compile(r"0x[0-9a-fA-F]{130}")


def canonical_query(query: str) -> str:
    """The query string with its pairs sorted, so parameter order cannot change a signature."""
    return urlencode(sorted(parse_qsl(query, keep_blank_values=True)))


def canonical_request(method: str, path: str, query: str, body_sha256: str, timestamp: int, nonce: str, audience: str) -> str:
    return "\n".join((SCHEME, method.upper(), path, canonical_query(query), body_sha256, str(timestamp), nonce, audience))


@spent("signing")
def sign_request(
    account: LocalAccount,
    method: str,
    path: str,
    query: str,
    body: bytes,
    audience: str,
    *,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The four signature headers for one request, the protocol version's and the body's hash."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    nonce = secrets.token_hex(16) if nonce is None else nonce
    body_sha256 = hashlib.sha256(body).hexdigest()
    message = canonical_request(method, path, query, body_sha256, timestamp, nonce, audience)
    return {
        HEADER_BODY_SHA256: body_sha256,
        HEADER_ADDRESS: account.address,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: sign_text(account, message),
        PROTOCOL_HEADER: str(PROTOCOL_VERSION),
    }


@spent("signing")
def sign_text(account: LocalAccount, message: str) -> str:
    """EIP-191 signature of ``message`` as 0x-prefixed hex."""
    return "0x" + account.sign_message(encode_defunct(text=message)).signature.hex().removeprefix("0x")


def recover_signer(
    method: str, path: str, query: str, body_sha256: str, timestamp: int, nonce: str, audience: str, signature: str
) -> str:
    """The checksummed address that produced ``signature`` over this request (its body given by
    its sha256 hex, so a large body is hashed once, as it arrives).

    Recovers with coincurve directly: the same EIP-191 check as eth-account's
    ``recover_message``, at half the cost, on the path every signed request takes.
    Raises ``ValueError`` when the signature is malformed or recovers no valid key.
    """
    return recover_text_signer(canonical_request(method, path, query, body_sha256, timestamp, nonce, audience), signature)


def recover_text_signer(text: str, signature: str) -> str:
    """The checksummed address whose EIP-191 ``signature`` this is over ``text``; ``ValueError`` if none."""
    if not SIGNATURE_PATTERN.fullmatch(signature):
        raise ValueError("signature must be 0x followed by 130 hex characters")
    raw = bytes.fromhex(signature[2:])
    v = raw[64] - 27 if raw[64] >= 27 else raw[64]
    if v not in (0, 1):
        raise ValueError("signature recovery id must be 27 or 28")
    message = text.encode()
    digest = keccak(b"\x19Ethereum Signed Message:\n" + str(len(message)).encode() + message)
    try:
        public_key = PublicKey.from_signature_and_message(raw[:64] + bytes([v]), digest, hasher=None)
    except Exception as e:  # coincurve raises bare Exception for an invalid signature
        raise ValueError(f"signature recovers no key: {e}") from None
    return to_checksum_address(keccak(public_key.format(compressed=False)[1:])[-20:])


class SignedAuth(httpx.Auth):
    """Signs every request of an httpx client for one coordinator deployment."""

    requires_request_body = True

    def __init__(self, account: LocalAccount, audience: str, *, clock_offset: float = 0.0) -> None:
        self.account = account
        self.audience = audience
        self.clock_offset = clock_offset
        """Seconds to add to the local clock, for a node that measured its skew."""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(
            sign_request(
                self.account,
                request.method,
                request.url.path,
                request.url.query.decode("ascii"),
                request.content,
                self.audience,
                timestamp=int(time.time() + self.clock_offset),
            )
        )
        yield request
