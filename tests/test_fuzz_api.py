"""Fuzz every endpoint of the coordinator from its own OpenAPI schema (schemathesis), unsigned and
signed by a registered node, in valid-looking and malformed shapes: never a 5xx, never a hang."""

from __future__ import annotations

import os

import pytest
import requests
import schemathesis
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.signing import sign_request
from tests.conftest import Served, _new_database, admin_token, serve
from tests.helpers import make_run, register_body, signed_post

EXAMPLES = {"positive": 6, "negative": 6}
"""Per operation, by mode (a malformed request is refused early: fewer find as much); `bench`-length runs raise
INTELLECT_FUZZ_EXAMPLES."""


class SignAs(requests.auth.AuthBase):
    """Sign the request exactly as it will be sent (method, path, query, raw body)."""

    def __init__(self, account, audience: str) -> None:
        self.account, self.audience = account, audience

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        path, _, query = (r.path_url or "/").partition("?")
        body = r.body if isinstance(r.body, bytes) else (r.body or "").encode()
        r.headers.update(sign_request(self.account, r.method or "GET", path, query, body, self.audience))
        return r


@pytest.fixture(scope="module")
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("fuzz")
    url = _new_database(request.param, request, tmp, request.getfixturevalue(f"migrated_{request.param}"))
    settings_ = CoordinatorSettings(
        database_url=url, blob_dir=tmp / "blobs", rate_limit_per_s=1e6, rate_limit_burst=10**6, manifest_wait_max_s=0.05
    )
    with serve(settings_) as s:
        make_run(s)
        yield s


def _sessions(served: Served) -> dict[str, requests.Session]:
    node = Account.create()
    assert signed_post(served.url, "/v1/nodes/register", node, served.audience, register_body(node)).status_code == 200
    unsigned, signed, admin = requests.Session(), requests.Session(), requests.Session()
    signed.auth = SignAs(node, served.audience)
    admin.headers["authorization"] = f"Bearer {admin_token(served, 'read')}"
    return {"unsigned": unsigned, "signed": signed, "admin-read": admin}


# Malformed requests are refused before they reach the ledger: fuzzed on PostgreSQL only (the stricter of the two
# where one gets through), valid-looking ones on both.
@pytest.mark.parametrize(
    ("served", "mode"),
    [
        ("sqlite", schemathesis.GenerationMode.POSITIVE),
        ("postgres", schemathesis.GenerationMode.POSITIVE),
        ("postgres", schemathesis.GenerationMode.NEGATIVE),
    ],
    indirect=["served"],
)
def test_no_request_makes_a_server_error(served: Served, mode) -> None:
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    sessions = _sessions(served)
    examples = int(os.environ.get("INTELLECT_FUZZ_EXAMPLES", EXAMPLES[mode.value]))
    seen: dict[int, int] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 40
    for operation in operations:

        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case) -> None:
            for name, session in sessions.items():
                response = case.call(base_url=served.url, session=session, timeout=10)  # long polls are capped at 50 ms here
                seen[response.status_code] = seen.get(response.status_code, 0) + 1
                assert response.status_code < 500, (
                    f"{name} {case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
                )

        try:
            check()
        except Unsatisfiable:
            assert mode == schemathesis.GenerationMode.NEGATIVE  # nothing in this operation can be malformed
    assert sum(seen.values()) > len(operations) * 3
    assert all(code < 500 for code in seen)
