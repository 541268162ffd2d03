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


class ApiError(Exception):
    def __init__(
        self,
        status_code: int,
        code: ErrorCode,
        message: str,
        details: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def error_response(
    status_code: int,
    code: ErrorCode,
    message: str,
    details: dict[str, object] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, object] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse(body, status_code=status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status_code, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()[:20]]
        return error_response(422, ErrorCode.validation_error, "The request does not match the schema.", {"errors": errors})

    # A value the database cannot store (a NUL byte in text on PostgreSQL, an integer wider than
    # the column on SQLite) can only come from the request: the transaction is rolled back already.
    @app.exception_handler(DataError)
    @app.exception_handler(OverflowError)
    async def _unstorable(_: Request, exc: Exception) -> JSONResponse:
        return error_response(
            422,
            ErrorCode.validation_error,
            "The request holds a value the ledger cannot store (a NUL byte, or a number too large).",
        )

    @app.exception_handler(BlobStoreUnavailable)
    async def _storage(_: Request, exc: BlobStoreUnavailable) -> JSONResponse:
        log.error("blob store unavailable: %s", exc)
        return error_response(
            503,
            ErrorCode.storage_unavailable,
            "The coordinator's file store is unavailable; nothing was recorded, try again shortly.",
            headers={"retry-after": str(STORAGE_RETRY_AFTER_S)},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.not_found if exc.status_code == 404 else ErrorCode.http_error
        return error_response(exc.status_code, code, str(exc.detail), headers=dict(exc.headers) if exc.headers else None)
