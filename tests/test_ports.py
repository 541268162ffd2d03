"""Servers the devnet and the tests start pick a free port and bind it a moment later: another server can take it in
between. Its /healthz names its process, so the launcher tells it apart instead of talking to the wrong server (a
stopping test granted roles on another test's coordinator and got 401), and picks another port."""

from __future__ import annotations

from pathlib import Path

import pytest

from intellect_protocol.devnet import processes
from intellect_protocol.devnet.processes import PortTaken, migrate, start_coordinator
from tests.helpers import HTTP


def test_a_coordinator_whose_port_another_took_is_told_apart_and_started_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = []
    for name in ("a", "b"):
        urls.append(f"sqlite:///{tmp_path / f'{name}.db'}")
        migrate(urls[-1], tmp_path / "logs" / f"migrate-{name}.log")
    first = start_coordinator(tmp_path / "a", urls[0])
    try:
        port = int(first.url.rsplit(":", 1)[1])
        with pytest.raises(PortTaken, match="lost its port"):
            start_coordinator(tmp_path / "b", urls[1], port=port)
        chosen, free = iter([port]), processes.free_port  # the next port handed out is the one the first holds
        monkeypatch.setattr(processes, "free_port", lambda: next(chosen, 0) or free())
        second = start_coordinator(tmp_path / "b", urls[1])
        try:
            assert second.url != first.url
            assert HTTP.get(f"{second.url}/healthz").json()["pid"] == second.popen.pid
        finally:
            second.stop()
    finally:
        first.stop()
