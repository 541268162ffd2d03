"""FastAPI dependencies, one per concern: settings, ledger, rate limit, signed request, admin token.

All are ``async def``: FastAPI runs a plain ``def`` dependency on a worker thread, a hop
that costs more than these functions do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from intellect_protocol.coordinator.context import Context
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.ledger import Ledger
from intellect_protocol.coordinator.media import is_json
from intellect_protocol.coordinator.models import AdminToken
from intellect_protocol.coordinator.services import admin_tokens, island_audits, submissions
from intellect_protocol.coordinator.services.rate_limit import RateLimiter
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.signed import SignedRequest
from intellect_protocol.coordinator.uploads import StagedUpload, stage
from intellect_protocol.shared import signing
from intellect_protocol.shared.schemas import ErrorCode
from intellect_protocol.shared.version import PROTOCOL_HEADER, PROTOCOL_VERSION, protocol_mismatch, sent_protocol


def context(request: Request) -> Context:
    """The app's shared :class:`Context` (a plain function: middleware and handlers call it too)."""
    ctx: Context = request.app.state.context
    return ctx


async def get_context(request: Request) -> Context:
    return context(request)


Ctx = Annotated[Context, Depends(get_context)]


async def get_settings(request: Request) -> CoordinatorSettings:
    return context(request).settings


Settings = Annotated[CoordinatorSettings, Depends(get_settings)]

LARGE_BODY = 256 << 10
"""Bodies above this are hashed on a thread rather than on the event loop."""


async def get_ledger(request: Request) -> Ledger:
    return context(request).ledger


LedgerDep = Annotated[Ledger, Depends(get_ledger)]


def _rate_limit(request: Request, key: str, limiter: RateLimiter | None = None, what: str = "Too many requests") -> None:
    wait = (limiter or context(request).rate_limiter).acquire(key)
    if wait > 0:
        raise ApiError(
            ErrorCode.rate_limited,
            f"{what}; retry in {wait:.1f} s.",
            {"retry_after_s": round(wait, 3)},
            headers={"Retry-After": str(max(1, round(wait)))},
        )


def _client_ip(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def client_rate_limit(request: Request) -> None:
    """Rate limit for unsigned endpoints, keyed by the client's IP."""
    _rate_limit(request, f"ip:{_client_ip(request)}")


async def aggregate_rate_limit(request: Request) -> None:
    """The tighter allowance of the public aggregates, keyed by the client's IP: each answer is large, and
    even served from the cache a flood of them takes the CPU that signed requests need."""
    _rate_limit(request, f"ip:{_client_ip(request)}", context(request).aggregate_limiter, "Too many reads of public aggregates")


async def registration_gate(request: Request, settings: Settings) -> Callable[[], None]:
    """What a registration calls before it creates a new node: raises 429 past the allowance of the client's
    network (its IP's /24 or /56 by default: addresses of one network are one client's to take)."""
    limiter = context(request).registration_limiter
    network = _network(_client_ip(request), settings.limits.registration_prefix_v4, settings.limits.registration_prefix_v6)
    return functools.partial(_rate_limit, request, network, limiter, f"Too many new nodes from {network}")


def _network(ip: str, v4: int, v6: int) -> str:
    """``ip``'s network of the given prefix lengths (``ip`` itself when it is not an address, e.g. a test client)."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    return str(ipaddress.ip_network(f"{address}/{v4 if address.version == 4 else v6}", strict=False))


RegistrationGate = Annotated[Callable[[], None], Depends(registration_gate)]


async def signed_request(request: Request, settings: Settings) -> SignedRequest:
    """Verify the request's signature headers; 401 with a code for every way they can be wrong.

    The nonce is not recorded here but by :meth:`Ledger.run_signed`, inside the request's transaction.
    """
    claimed = _signature_headers(request, settings)
    body = await request.body()
    digest = await asyncio.to_thread(_sha256, body) if len(body) > LARGE_BODY else _sha256(body)
    signed = await _verify(request, claimed, digest)
    if body and is_json(request.headers.get("content-type")):
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            payload = None  # left for the framework's parse to refuse
        if isinstance(payload, dict) and "address" in payload:
            named = payload["address"]
            if not isinstance(named, str) or named.lower() != signed.address.lower():
                raise ApiError(ErrorCode.address_mismatch, "The body names an address other than the signer.")
    return signed


async def signed_upload(
    request: Request, settings: Settings, ledger: LedgerDep
) -> AsyncIterator[tuple[SignedRequest, StagedUpload]]:
    """A signed request whose (large, binary) body is staged to a file as it arrives and hashed
    once; the staged file is removed after the response unless the handler stored it.

    The signature is checked from the headers, over the body's hash they declare, before a byte of the
    body is read; the staged body must then have that hash. Nothing is staged for an upload its headers
    already condemn (:func:`submissions.admit_upload`), and each signer stages at most
    ``max_leases_per_node`` new files at once (and one retry of a submitted one): its own share, which
    nobody else's bodies can fill, so a stranger knowing a node's task ids cannot hold up its uploads."""
    signed, declared = await _signed_digest(request, settings)
    task_id = request.query_params.get("task", "")
    retry, newcomer = await ledger.run(submissions.admit_upload, signed.address, signed.nonce, task_id, ledger.now())
    if newcomer and not retry:
        network = _network(_client_ip(request), settings.limits.registration_prefix_v4, settings.limits.registration_prefix_v6)
        what = f"Nodes with no accepted file yet upload {settings.limits.newcomer_uploads_per_s:g} files a second from {network}"
        _rate_limit(request, network, context(request).newcomer_uploads, what)
    share = ("retry", 1) if retry else ("new", settings.max_leases_per_node)
    async with _staged(request, signed, declared, *share) as staged:
        yield signed, staged


async def signed_pseudo_gradient(
    request: Request, settings: Settings, ledger: LedgerDep
) -> AsyncIterator[tuple[SignedRequest, StagedUpload]]:
    """A trainer's upload of a pseudo-gradient drawn for audit, staged as :func:`signed_upload` stages a rollout
    file: refused from its headers unless a drawn audit of the run awaits a body of the declared sha256
    (:func:`island_audits.admit_upload`), one at a time per signer."""
    signed, declared = await _signed_digest(request, settings)
    await ledger.run(island_audits.admit_upload, signed.address, request.query_params.get("run", ""), declared)
    async with _staged(request, signed, declared, "pseudo-gradient", 1) as staged:
        yield signed, staged


async def _signed_digest(request: Request, settings: CoordinatorSettings) -> tuple[SignedRequest, str]:
    """An upload's verified signature, over the sha256 its headers declare for the body (not read yet)."""
    claimed = _signature_headers(request, settings)
    declared = request.headers.get(signing.HEADER_BODY_SHA256, "")
    if not signing.SHA256_PATTERN.fullmatch(declared):
        raise ApiError(
            ErrorCode.signature_missing, f"An upload names its body's sha256 in {signing.HEADER_BODY_SHA256} (64 hex digits)."
        )
    return await _verify(request, claimed, declared), declared


@contextlib.asynccontextmanager
async def _staged(request: Request, signed: SignedRequest, declared: str, kind: str, share: int) -> AsyncIterator[StagedUpload]:
    """The body staged to a file, if it has the ``declared`` sha256 (401 if not), within the signer's ``share`` of
    uploads of ``kind`` at once (429 past it); the file is removed afterwards unless the handler stored it."""
    staging = context(request).staging
    who = f"{signed.address.lower()}:{kind}"
    if staging[who] >= share:
        raise ApiError(
            ErrorCode.rate_limited,
            f"This address already uploads {staging[who]} files at once.",
            headers={"Retry-After": "2"},
        )
    staging[who] += 1
    try:
        staged = await stage(request, context(request).blobs.staging)
        try:
            if staged.sha256 != declared:
                raise ApiError(ErrorCode.signature_invalid, "The body is not the one whose sha256 the request signed.")
            yield staged
        finally:
            await asyncio.to_thread(staged.discard)  # freeing a large file's blocks takes milliseconds
    finally:
        staging[who] -= 1
        if not staging[who]:
            del staging[who]


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _signature_headers(request: Request, settings: CoordinatorSettings) -> tuple[str, int, str, str]:
    """(claimed address, timestamp, nonce, signature), checked for form and freshness."""
    headers = request.headers
    address = headers.get(signing.HEADER_ADDRESS)
    timestamp_raw = headers.get(signing.HEADER_TIMESTAMP)
    nonce = headers.get(signing.HEADER_NONCE)
    signature = headers.get(signing.HEADER_SIGNATURE)
    if not (address and timestamp_raw and nonce and signature):
        raise ApiError(ErrorCode.signature_missing, "This endpoint needs a signed request (x-intellect-* headers).")
    theirs = sent_protocol(headers.get(PROTOCOL_HEADER))
    if theirs is None:
        raise ApiError(ErrorCode.signature_malformed, f"The {PROTOCOL_HEADER} header must be a protocol number.")
    mismatch = protocol_mismatch(theirs, PROTOCOL_VERSION)
    if mismatch is not None:
        raise ApiError(ErrorCode.version_unsupported, mismatch, {"coordinator_protocol": PROTOCOL_VERSION})
    if not (
        timestamp_raw.isascii()
        and timestamp_raw.isdigit()
        and len(timestamp_raw) <= 12
        and signing.NONCE_PATTERN.fullmatch(nonce)
    ):
        raise ApiError(ErrorCode.signature_malformed, "The timestamp must be unix seconds and the nonce 16-64 hex characters.")
    timestamp = int(timestamp_raw)
    now = time.time()
    if abs(now - timestamp) > settings.signature_window_s:
        raise ApiError(
            ErrorCode.timestamp_out_of_window,
            f"The request's timestamp is {now - timestamp:+.0f} s from the coordinator's clock "
            f"(allowed: ±{settings.signature_window_s} s).",
            {"server_time": now, "skew_s": round(timestamp - now, 3), "window_s": settings.signature_window_s},
        )
    return address, timestamp, nonce, signature


async def _verify(request: Request, claimed: tuple[str, int, str, str], body_sha256: str) -> SignedRequest:
    address, timestamp, nonce, signature = claimed
    try:
        signer_address = signing.recover_signer(
            request.method,
            request.url.path,
            request.url.query,
            body_sha256,
            timestamp,
            nonce,
            context(request).audience,
            signature,
        )
    except ValueError:
        raise ApiError(ErrorCode.signature_malformed, "The signature cannot be decoded.") from None
    if signer_address.lower() != address.lower():
        raise ApiError(
            ErrorCode.signature_invalid,
            "The signature does not match this request, this deployment's audience, or the claimed address.",
        )
    _rate_limit(request, signer_address)
    return SignedRequest(address=signer_address, nonce=nonce, timestamp=timestamp)


Signed = Annotated[SignedRequest, Depends(signed_request)]
"""A verified signed request; pass it to :meth:`Ledger.run_signed` so its nonce is recorded."""

SignedUpload = Annotated[tuple[SignedRequest, StagedUpload], Depends(signed_upload)]
"""A verified signed request and its body, staged in a file (for rollout uploads)."""

SignedPseudoGradient = Annotated[tuple[SignedRequest, StagedUpload], Depends(signed_pseudo_gradient)]
"""A trainer's verified upload of a pseudo-gradient drawn for audit, staged in a file."""


def require_admin(scope: str) -> Callable[[Request, Ledger], Awaitable[AdminToken]]:
    """A dependency admitting bearer tokens that hold ``scope`` (or a wider one)."""

    async def admin(request: Request, ledger: LedgerDep) -> AdminToken:
        header = request.headers.get("authorization", "")
        kind, _, token = header.partition(" ")
        row = await ledger.run(admin_tokens.verify_token, token.strip()) if kind.lower() == "bearer" else None
        if row is None:
            raise ApiError(
                ErrorCode.admin_unauthorized,
                "An admin bearer token is needed (create one with: intellect-coordinator admin-token create).",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not admin_tokens.has_scope(row, scope):
            raise ApiError(ErrorCode.admin_forbidden, f"This token's scope is {row.scopes}; this needs {scope}.")
        return row

    return admin
