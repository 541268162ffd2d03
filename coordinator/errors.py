"""API errors: every failure leaves as ``{code, message, details}`` with a fitting status."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from intellect_protocol.coordinator.blobs import BlobStoreUnavailable
from intellect_protocol.shared.schemas import ErrorCode

log = logging.getLogger(__name__)
STORAGE_RETRY_AFTER_S = 5


STATUS_OF: dict[ErrorCode, int] = {
    ErrorCode.signature_missing: 401,
    ErrorCode.signature_malformed: 401,
    ErrorCode.signature_invalid: 401,
    ErrorCode.timestamp_out_of_window: 401,
    ErrorCode.nonce_reused: 401,
    ErrorCode.address_mismatch: 401,
    ErrorCode.admin_unauthorized: 401,
    ErrorCode.admin_forbidden: 403,
    ErrorCode.node_banned: 403,
    ErrorCode.stake_too_low: 403,
    ErrorCode.task_not_leased: 403,
    ErrorCode.own_work: 403,
    ErrorCode.role_required: 403,
    ErrorCode.manifest_signer_mismatch: 403,
    ErrorCode.not_submitter: 403,
    ErrorCode.not_found: 404,
    ErrorCode.node_not_registered: 404,
    ErrorCode.no_run: 404,
    ErrorCode.request_timeout: 408,
    ErrorCode.conflict: 409,
    ErrorCode.lease_expired: 409,
    ErrorCode.awaiting_vouches: 409,
    ErrorCode.plugin_works_here: 409,
    ErrorCode.body_too_large: 413,
    ErrorCode.validation_error: 422,
    ErrorCode.rollout_invalid: 422,
    ErrorCode.manifest_invalid: 422,
    ErrorCode.body_signature_invalid: 422,
    ErrorCode.version_unsupported: 426,
    ErrorCode.rate_limited: 429,
    ErrorCode.chain_unavailable: 503,
    ErrorCode.environment_unavailable: 503,
    ErrorCode.storage_unavailable: 503,
    ErrorCode.overloaded: 503,
    ErrorCode.http_error: 400,  # the framework's own refusals keep the status it chose (see the handler below)
}
"""The one place an error code gets its HTTP status: services and middleware name the code only."""


class ApiError(Exception):
    """A refusal, raised by a service: a code (clients branch on it) and a sentence an operator can act on."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        details: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = STATUS_OF[code]
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def error_response(
    code: ErrorCode,
    message: str,
    details: dict[str, object] | None = None,
    headers: dict[str, str] | None = None,
    status_code: int | None = None,
) -> JSONResponse:
    """The JSON body every refusal has; the status is the code's (:data:`STATUS_OF`) unless given."""
    body: dict[str, object] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse(body, status_code=STATUS_OF[code] if status_code is None else status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()[:20]]
        return error_response(ErrorCode.validation_error, "The request does not match the schema.", {"errors": errors})

    # A value the database cannot store (a NUL byte in text on PostgreSQL, an integer wider than
    # the column on SQLite) can only come from the request: the transaction is rolled back already.
    @app.exception_handler(DataError)
    @app.exception_handler(OverflowError)
    async def _unstorable(_: Request, _exc: Exception) -> JSONResponse:
        return error_response(
            ErrorCode.validation_error,
            "The request holds a value the ledger cannot store (a NUL byte, or a number too large).",
        )

    @app.exception_handler(BlobStoreUnavailable)
    async def _storage(_: Request, exc: BlobStoreUnavailable) -> JSONResponse:
        log.error("blob store unavailable: %s", exc)
        return error_response(
            ErrorCode.storage_unavailable,
            "The coordinator's file store is unavailable; nothing was recorded, try again shortly.",
            headers={"retry-after": str(STORAGE_RETRY_AFTER_S)},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.not_found if exc.status_code == 404 else ErrorCode.http_error
        headers = dict(exc.headers) if exc.headers else None
        return error_response(code, str(exc.detail), headers=headers, status_code=exc.status_code)
