"""Every error code has exactly one HTTP status, given in one place."""

from __future__ import annotations

import pytest

from intellect_protocol.coordinator.errors import STATUS_OF, ApiError, error_response
from intellect_protocol.shared.schemas import ErrorCode

pytestmark = pytest.mark.unit


def test_every_code_has_a_status_and_a_refusal_carries_it() -> None:
    assert set(STATUS_OF) == set(ErrorCode)
    for code, status in STATUS_OF.items():
        assert 400 <= status < 600
        assert ApiError(code, "no").status_code == status
        assert error_response(code, "no").status_code == status


def test_the_frameworks_own_refusals_keep_their_status() -> None:
    assert error_response(ErrorCode.http_error, "Method Not Allowed", status_code=405).status_code == 405
