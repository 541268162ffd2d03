"""Public status, health and metrics endpoints, and the error format."""

from __future__ import annotations

from tests.helpers import HTTP, register_body, signed_post


def test_public_status(coordinator, account) -> None:
    signed_post(coordinator.url, "/v1/nodes/register", account, coordinator.audience, register_body(account)).raise_for_status()
    status = HTTP.get(f"{coordinator.url}/v1/public/status").json()
    assert status["audience"] == coordinator.audience and status["audience"].startswith("intellect-")
    assert status["nodes"] == {"registered": 1, "healthy": 0, "unhealthy": 0, "dead": 0, "banned": 0}
    assert status["signature_window_s"] == 300


def test_each_deployment_has_its_own_audience(coordinator, tmp_path) -> None:
    from alembic import command

    from intellect_protocol.coordinator.db import (
        alembic_config,
        make_engine,
        make_sessionmaker,
        read_audience,
    )

    other = f"sqlite:///{tmp_path / 'other.db'}"
    command.upgrade(alembic_config(other), "head")
    with make_sessionmaker(make_engine(other))() as session:
        assert read_audience(session) != coordinator.audience


def test_healthz_and_metrics(coordinator) -> None:
    health = HTTP.get(f"{coordinator.url}/healthz")
    assert health.status_code == 200
    body = health.json()
    assert body["database"] == "ok" and body["loops"]["node-status"]["alive"] is True
    HTTP.get(f"{coordinator.url}/v1/public/time")
    HTTP.get(f"{coordinator.url}/no/such/path")
    metrics = HTTP.get(f"{coordinator.url}/metrics").text
    assert 'intellect_http_requests_total{method="GET",route="/v1/public/time",status="200"} 1.0' in metrics
    assert 'route="unmatched",status="404"' in metrics
    assert "/no/such/path" not in metrics


def test_errors_have_code_and_message(coordinator) -> None:
    for response in (HTTP.get(f"{coordinator.url}/nowhere"), HTTP.put(f"{coordinator.url}/v1/nodes/register")):
        body = response.json()
        assert set(body) >= {"code", "message"}, body


def test_openapi_documents_the_api(coordinator) -> None:
    paths = HTTP.get(f"{coordinator.url}/openapi.json").json()["paths"]
    assert {"/v1/nodes/register", "/v1/nodes/heartbeat", "/v1/admin/nodes", "/v1/public/status"} <= set(paths)


def test_the_public_api_lists_itself(coordinator) -> None:
    index = HTTP.get(f"{coordinator.url}/v1/public")
    assert index.status_code == 200
    endpoints = index.json()["endpoints"]
    assert {"/v1/public/status", "/v1/public/leaderboard", "/v1/public/epochs", "/v1/public/nodes/{address}"} <= set(endpoints)
    assert not any(path.startswith(("/v1/admin", "/v1/nodes")) for path in endpoints)
    # Every endpoint listed without a path parameter is there (422: it wants a query parameter).
    for path in (p for p in endpoints if "{" not in p):
        assert HTTP.get(f"{coordinator.url}{path}").status_code in (200, 404, 422), path
