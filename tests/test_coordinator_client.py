"""The one protocol client's retry policy, through a real coordinator: a validator rides out the
coordinator answering 503 (overloaded) and 429 (rate limited) on its claims and finishes its
work; refusals are typed; a stop ends any wait at once."""

from __future__ import annotations

import io
import socket
import threading
import time
from pathlib import Path

import pytest
from eth_account import Account
from rich.console import Console

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused, Stopped, Unavailable
from intellect_protocol.shared.schemas import ClaimRequest, SamplingParams
from intellect_protocol.validator.worker import Validator
from tests.conftest import Served, admin_token, serve
from tests.support.protocol import grant, joined, lease, upload


def _with_work(served: Served, files: int) -> tuple[Validator, io.StringIO]:
    from tests.helpers import make_run

    make_run(served, sampling=SamplingParams(max_tokens=24), prompts=1, samples=2)
    key = Account.create()
    grant(served, admin_token(served), key.address, "validator")
    for _ in range(files):
        node = joined(served)
        task = lease(served, node)
        upload(served, node, task, finish(generate(task)).data)
    out = io.StringIO()
    return Validator(served.url, key, served.settings.blob_root / "validator", Console(file=out, width=300), batch=1), out


def _hog(served: Served, seconds: float) -> threading.Thread:
    """Holds the coordinator's whole in-flight body budget for ``seconds``: a JSON request that
    declares 1 MiB and sends none of it, so every other request with a body is answered 503."""
    host, port = served.url.removeprefix("http://").split(":")

    def hold() -> None:
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                b"POST /v1/nodes/heartbeat HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1048576\r\n\r\n"
            )
            time.sleep(seconds)

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def test_a_validator_rides_out_503_on_claim(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", max_body_bytes_in_flight=1 << 20)
    with serve(settings) as served:
        validator, out = _with_work(served, 2)
        hog = _hog(served, 3.0)
        time.sleep(0.5)  # the hog's headers are in
        try:
            assert validator.run(max_submissions=2) == 2
        finally:
            validator.close()
            hog.join()
        assert "HTTP 503" in out.getvalue() and "retrying POST /v1/validation/claim" in out.getvalue(), out.getvalue()


def test_a_validator_rides_out_429_on_claim(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", rate_limit_per_s=1.0, rate_limit_burst=3)
    with serve(settings) as served:
        validator, out = _with_work(served, 3)
        try:
            assert validator.run(max_submissions=3) == 3
        finally:
            validator.close()
        assert "slow down (429)" in out.getvalue(), out.getvalue()


def test_refusals_are_typed_and_stop_ends_the_wait(coordinator) -> None:
    stranger = Account.create()
    with CoordinatorClient(coordinator.url, stranger) as api:
        assert api.audience == coordinator.audience
        with pytest.raises(Refused) as refused:
            api.claim(ClaimRequest(address=stranger.address))
        assert refused.value.status == 403 and refused.value.code == "role_required"

    from intellect_protocol.devnet.processes import free_port

    stop = threading.Event()
    nowhere = CoordinatorClient(f"http://127.0.0.1:{free_port()}", stop=stop, first_wait_s=5.0)
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Stopped):
        nowhere.public_status()
    assert time.monotonic() - started < 3
    with pytest.raises(Unavailable, match="cannot reach"):
        CoordinatorClient(nowhere.base_url, give_up_s=0).public_status()
