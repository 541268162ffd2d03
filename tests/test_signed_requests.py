"""Every way a signed request can be wrong gets 401 with its code, and changes no row."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from eth_account import Account

from intellect_protocol.shared.signing import (
    HEADER_ADDRESS,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    canonical_query,
    sign_request,
)
from intellect_protocol.shared.version import PROTOCOL_HEADER, PROTOCOL_VERSION
from tests.helpers import HTTP, heartbeat_body, register_body, signed_post

REGISTER, HEARTBEAT = "/v1/nodes/register", "/v1/nodes/heartbeat"


@pytest.fixture
def registered(coordinator, account):
    response = signed_post(coordinator.url, REGISTER, account, coordinator.audience, register_body(account))
    assert response.status_code == 200, response.text
    return account


def assert_refused(coordinator, response: httpx.Response, status: int, code: str, before: dict) -> None:
    assert response.status_code == status, response.text
    assert response.json()["code"] == code
    assert coordinator.snapshot() == before


def test_register_and_heartbeat_accepted(coordinator, registered) -> None:
    response = signed_post(coordinator.url, HEARTBEAT, registered, coordinator.audience, heartbeat_body(registered))
    assert response.status_code == 200
    assert response.json()["action"] == "continue"
    assert response.json()["status"] == "healthy"
    nonces = coordinator.snapshot()["nonces"]
    assert len(nonces) == 2  # one per accepted request


def test_missing_headers(coordinator, registered) -> None:
    before = coordinator.snapshot()
    response = HTTP.post(coordinator.url + HEARTBEAT, json=heartbeat_body(registered))
    assert_refused(coordinator, response, 401, "signature_missing", before)


def test_malformed_signature_and_nonce(coordinator, registered) -> None:
    before = coordinator.snapshot()
    response = signed_post(
        coordinator.url,
        HEARTBEAT,
        registered,
        coordinator.audience,
        heartbeat_body(registered),
        headers={HEADER_SIGNATURE: "0x1234"},
    )
    assert_refused(coordinator, response, 401, "signature_malformed", before)
    response = signed_post(
        coordinator.url,
        HEARTBEAT,
        registered,
        coordinator.audience,
        heartbeat_body(registered),
        headers={HEADER_NONCE: "not-hex!"},
    )
    assert_refused(coordinator, response, 401, "signature_malformed", before)
    response = signed_post(
        coordinator.url,
        HEARTBEAT,
        registered,
        coordinator.audience,
        heartbeat_body(registered),
        headers={HEADER_TIMESTAMP: "yesterday"},
    )
    assert_refused(coordinator, response, 401, "signature_malformed", before)


def test_body_altered_after_signing(coordinator, registered) -> None:
    before = coordinator.snapshot()
    body = json.dumps(heartbeat_body(registered)).encode()
    headers = sign_request(registered, "POST", HEARTBEAT, "", body, coordinator.audience)
    altered = body.replace(b'"idle"', b'"generating"')
    response = HTTP.post(coordinator.url + HEARTBEAT, content=altered, headers={"content-type": "application/json", **headers})
    assert_refused(coordinator, response, 401, "signature_invalid", before)


def test_path_and_query_altered_after_signing(coordinator, registered) -> None:
    before = coordinator.snapshot()
    body = json.dumps(register_body(registered)).encode()
    headers = {"content-type": "application/json", **sign_request(registered, "POST", REGISTER, "", body, coordinator.audience)}
    response = HTTP.post(coordinator.url + HEARTBEAT, content=body, headers=headers)
    assert_refused(coordinator, response, 401, "signature_invalid", before)
    response = HTTP.post(coordinator.url + REGISTER + "?run=other", content=body, headers=headers)
    assert_refused(coordinator, response, 401, "signature_invalid", before)


def test_query_order_does_not_matter_but_values_do(coordinator, registered) -> None:
    assert canonical_query("b=2&a=1") == canonical_query("a=1&b=2")
    assert canonical_query("a=1&b=2") != canonical_query("a=1&b=3")
    body = heartbeat_body(registered)
    response = signed_post(coordinator.url, HEARTBEAT, registered, coordinator.audience, body, query="z=1&a=2")
    assert response.status_code == 200  # signed over the sorted query, sent unsorted


def test_other_audience(coordinator, registered) -> None:
    before = coordinator.snapshot()
    response = signed_post(coordinator.url, HEARTBEAT, registered, "intellect-some-other-deployment", heartbeat_body(registered))
    assert_refused(coordinator, response, 401, "signature_invalid", before)


def test_claimed_address_is_not_the_signer(coordinator, registered) -> None:
    before = coordinator.snapshot()
    impostor = Account.create()
    response = signed_post(
        coordinator.url,
        HEARTBEAT,
        impostor,
        coordinator.audience,
        heartbeat_body(registered),
        headers={HEADER_ADDRESS: registered.address},
    )
    assert_refused(coordinator, response, 401, "signature_invalid", before)


@pytest.mark.parametrize("offset", [-400, 400])
def test_timestamp_outside_window(coordinator, registered, offset: int) -> None:
    before = coordinator.snapshot()
    response = signed_post(
        coordinator.url,
        HEARTBEAT,
        registered,
        coordinator.audience,
        heartbeat_body(registered),
        timestamp=int(time.time()) + offset,
    )
    assert_refused(coordinator, response, 401, "timestamp_out_of_window", before)
    assert abs(response.json()["details"]["server_time"] - time.time()) < 30


def test_replayed_request(coordinator, registered) -> None:
    body = json.dumps(heartbeat_body(registered)).encode()
    headers = {"content-type": "application/json", **sign_request(registered, "POST", HEARTBEAT, "", body, coordinator.audience)}
    assert HTTP.post(coordinator.url + HEARTBEAT, content=body, headers=headers).status_code == 200
    before = coordinator.snapshot()
    response = HTTP.post(coordinator.url + HEARTBEAT, content=body, headers=headers)
    assert_refused(coordinator, response, 401, "nonce_reused", before)


def test_body_names_another_address(coordinator, registered) -> None:
    before = coordinator.snapshot()
    victim = Account.create()
    response = signed_post(
        coordinator.url, HEARTBEAT, registered, coordinator.audience, heartbeat_body(registered, address=victim.address)
    )
    assert_refused(coordinator, response, 401, "address_mismatch", before)


def test_schema_violations_are_422_and_record_nothing(coordinator, registered) -> None:
    before = coordinator.snapshot()
    for bad in (
        heartbeat_body(registered, metrics={f"m{i}": 1.0 for i in range(65)}),
        heartbeat_body(registered, activity="x" * 65),
        heartbeat_body(registered, unexpected=True),
        heartbeat_body(registered, client_version="latest"),
    ):
        response = signed_post(coordinator.url, HEARTBEAT, registered, coordinator.audience, bad)
        assert_refused(coordinator, response, 422, "validation_error", before)
    response = signed_post(coordinator.url, HEARTBEAT, registered, coordinator.audience, b"{not json")
    assert_refused(coordinator, response, 422, "validation_error", before)


def test_heartbeat_before_register(coordinator, account) -> None:
    before = coordinator.snapshot()
    response = signed_post(coordinator.url, HEARTBEAT, account, coordinator.audience, heartbeat_body(account))
    assert_refused(coordinator, response, 404, "node_not_registered", before)


def test_old_client_version(coordinator, account) -> None:
    before = coordinator.snapshot()
    response = signed_post(
        coordinator.url, REGISTER, account, coordinator.audience, register_body(account, client_version="0.0.1")
    )
    assert_refused(coordinator, response, 426, "version_unsupported", before)
    assert response.json()["details"]["min_node_version"] == coordinator.settings.min_node_version


def test_register_is_idempotent(coordinator, registered) -> None:
    first = coordinator.snapshot()["nodes"]
    response = signed_post(coordinator.url, REGISTER, registered, coordinator.audience, register_body(registered))
    assert response.status_code == 200
    assert len(coordinator.snapshot()["nodes"]) == len(first) == 1
    assert len(coordinator.snapshot()["node_status_events"]) == 1


@pytest.mark.parametrize(
    ("sent", "status", "code", "says"),
    [
        (
            None,
            426,
            "version_unsupported",
            f"speaks protocol 1 and the coordinator protocol {PROTOCOL_VERSION}: upgrade the client",
        ),
        (
            "1",
            426,
            "version_unsupported",
            f"speaks protocol 1 and the coordinator protocol {PROTOCOL_VERSION}: upgrade the client",
        ),
        (str(PROTOCOL_VERSION - 1), 426, "version_unsupported", "upgrade the client"),
        (str(PROTOCOL_VERSION + 1), 426, "version_unsupported", "the coordinator must upgrade first"),
        ("two", 401, "signature_malformed", "must be a protocol number"),
    ],
)
def test_another_protocol_is_refused_saying_which_side_must_upgrade(coordinator, account, sent, status, code, says) -> None:
    before = coordinator.snapshot()
    body = json.dumps(register_body(account)).encode()
    headers = {"content-type": "application/json", **sign_request(account, "POST", REGISTER, "", body, coordinator.audience)}
    del headers[PROTOCOL_HEADER]
    if sent is not None:
        headers[PROTOCOL_HEADER] = sent
    response = HTTP.post(coordinator.url + REGISTER, content=body, headers=headers)
    assert_refused(coordinator, response, status, code, before)
    assert says in response.json()["message"]
    assert HTTP.get(coordinator.url + "/v1/public/status").json()["protocol_version"] == PROTOCOL_VERSION
