"""The admin API: bearer tokens with scopes, node listing, detail, ban and unban."""

from __future__ import annotations

import subprocess

from eth_account import Account

from tests.conftest import ON_POSTGRES_ONLY, admin_token
from tests.helpers import HTTP, heartbeat_body, register_body, signed_post


def _register(coordinator, n: int) -> list:
    accounts = [Account.create() for _ in range(n)]
    for account in accounts:
        assert (
            signed_post(coordinator.url, "/v1/nodes/register", account, coordinator.audience, register_body(account)).status_code
            == 200
        )
    return accounts


def test_tokens_are_required_and_scoped(coordinator) -> None:
    [node] = _register(coordinator, 1)
    url = f"{coordinator.url}/v1/admin/nodes"
    assert HTTP.get(url).json()["code"] == "admin_unauthorized"
    assert HTTP.get(url, headers={"authorization": "Bearer ipa_1_" + "A" * 43}).status_code == 401
    assert HTTP.get(url, headers={"authorization": "Basic abc"}).status_code == 401

    reader = admin_token(coordinator, "read")
    assert HTTP.get(url, headers={"authorization": f"Bearer {reader}"}).status_code == 200
    before = coordinator.snapshot()
    response = HTTP.post(f"{url}/{node.address}/ban", json={"reason": "x"}, headers={"authorization": f"Bearer {reader}"})
    assert response.status_code == 403
    assert response.json()["code"] == "admin_forbidden"
    assert coordinator.snapshot() == before

    # A token whose secret is altered in one character is refused.
    tampered = reader[:-1] + ("A" if reader[-1] != "A" else "B")
    assert HTTP.get(url, headers={"authorization": f"Bearer {tampered}"}).status_code == 401


def test_tokens_are_stored_hashed(coordinator) -> None:
    token = admin_token(coordinator)
    secret = token.split("_", 2)[2]
    rows = coordinator.snapshot()["admin_tokens"]
    assert rows and all(secret not in repr(row) for row in rows)


def test_list_filter_detail_ban_unban(coordinator) -> None:
    a, b, c = _register(coordinator, 3)
    assert (
        signed_post(coordinator.url, "/v1/nodes/heartbeat", a, coordinator.audience, heartbeat_body(a)).json()["status"]
        == "healthy"
    )
    auth = {"authorization": f"Bearer {admin_token(coordinator, 'operate')}"}
    base = f"{coordinator.url}/v1/admin/nodes"

    listing = HTTP.get(base, headers=auth).json()
    assert listing["counts"]["registered"] == 2 and listing["counts"]["healthy"] == 1
    healthy = HTTP.get(base, params={"status": "healthy"}, headers=auth).json()["nodes"]
    assert [n["address"] for n in healthy] == [a.address]
    assert HTTP.get(base, params={"status": "sleepy"}, headers=auth).json()["code"] == "validation_error"

    detail = HTTP.get(f"{base}/{a.address.lower()}", headers=auth).json()
    assert detail["address"] == a.address
    assert [e["to_status"] for e in detail["events"]] == ["healthy", "registered"]
    assert HTTP.get(f"{base}/0x{'1' * 40}", headers=auth).status_code == 404
    assert HTTP.get(f"{base}/nonsense", headers=auth).status_code == 422

    banned = HTTP.post(f"{base}/{b.address}/ban", json={"reason": "forged proofs"}, headers=auth).json()
    assert banned["status"] == "banned" and banned["ban_reason"] == "forged proofs"
    assert HTTP.post(f"{base}/{b.address}/ban", json={"reason": "again"}, headers=auth).status_code == 409

    # A banned node is told to stop, and may not register again.
    beat = signed_post(coordinator.url, "/v1/nodes/heartbeat", b, coordinator.audience, heartbeat_body(b)).json()
    assert (
        beat["action"] == "stop"
        and beat["reason"] == "banned by the coordinator's operator: forged proofs. Contact them to appeal"
    )
    before = coordinator.snapshot()
    refused = signed_post(coordinator.url, "/v1/nodes/register", b, coordinator.audience, register_body(b))
    assert refused.status_code == 403 and refused.json()["code"] == "node_banned"
    assert coordinator.snapshot() == before

    unbanned = HTTP.post(f"{base}/{b.address}/unban", json={"reason": "appeal upheld"}, headers=auth).json()
    assert unbanned["status"] == "unhealthy" and unbanned["ban_reason"] is None
    beat = signed_post(coordinator.url, "/v1/nodes/heartbeat", b, coordinator.audience, heartbeat_body(b)).json()
    assert beat == {**beat, "action": "continue", "status": "healthy"}
    assert [e["to_status"] for e in HTTP.get(f"{base}/{b.address}", headers=auth).json()["events"]] == [
        "healthy",
        "unhealthy",
        "banned",
        "registered",
    ]


@ON_POSTGRES_ONLY
def test_token_cli_create_list_revoke(coordinator) -> None:
    url = coordinator.settings.database_url
    created = subprocess.run(
        ["intellect-coordinator", "admin-token", "create", "--name", "ops", "--scope", "read", "--database-url", url],
        capture_output=True,
        text=True,
        check=True,
    )
    token = created.stdout.strip()
    assert token.startswith("ipa_")
    headers = {"authorization": f"Bearer {token}"}
    assert HTTP.get(f"{coordinator.url}/v1/admin/nodes", headers=headers).status_code == 200
    listed = subprocess.run(
        ["intellect-coordinator", "admin-token", "list", "--database-url", url], capture_output=True, text=True, check=True
    )
    assert "ops" in listed.stdout and token.split("_", 2)[2] not in listed.stdout
    token_id = token.split("_")[1]
    subprocess.run(
        ["intellect-coordinator", "admin-token", "revoke", token_id, "--database-url", url], check=True, capture_output=True
    )
    assert HTTP.get(f"{coordinator.url}/v1/admin/nodes", headers=headers).status_code == 401
    bad = subprocess.run(
        ["intellect-coordinator", "admin-token", "create", "--name", "x", "--scope", "root", "--database-url", url],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "scope" in bad.stderr and "Traceback" not in bad.stderr
