"""Fixtures: real databases (SQLite files and a PostgreSQL server this session starts), real
coordinators served by uvicorn on loopback, real keys."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from alembic import command
from eth_account import Account
from sqlalchemy import Engine, inspect, text

from intellect_protocol.coordinator.app import create_app
from intellect_protocol.coordinator.clock import Clock, system_clock
from intellect_protocol.coordinator.db import alembic_config, make_engine
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.certificates import ServerFiles
from intellect_protocol.devnet.postgres import create_database, pg_bin
from intellect_protocol.devnet.postgres import postgres_server as postgres_server_at
from intellect_protocol.devnet.processes import free_port
from intellect_protocol.shared.serving import server_config
from intellect_protocol.shared.tls import server_tls

os.environ.setdefault("INTELLECT_WALLET_PASSWORD", "test-password")


def pytest_configure(config: pytest.Config) -> None:
    """On xdist's workers, torch (here and in the processes tests start) runs one thread: two workers
    of two threads each on two cores slow each other down several times over."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test module marked neither ``unit`` nor ``e2e`` is ``integration``: the stages run
    ``-m unit``, ``-m integration``, ``-m e2e``, and every test is in exactly one. Tests marked
    ``early`` go first, so that on two workers the rest of the stage runs beside them.

    The e2e stage runs on two workers, each one half of it (the xdist groups ``e2e-a`` and
    ``e2e-b``, of about equal length): a whole network keeps about 1.2 of two cores busy, so
    two run side by side in little more time than one."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("unit", "e2e")):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("early") is None)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server of our own on a free loopback port; yields its admin URL."""
    if pg_bin() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries (initdb) are missing; .ci/run must install postgresql.")
        pytest.skip("PostgreSQL server binaries are not installed (apt-get install postgresql)")
    with postgres_server_at(Path(tempfile.mkdtemp(prefix="intellect-pg-"))) as url:
        yield url


def _new_database(kind: str, request: pytest.FixtureRequest, tmp_path: Path, template: str | None = None) -> str:
    if kind == "sqlite":
        path = tmp_path / "ledger.db"
        if template is not None:
            shutil.copyfile(template, path)
        return f"sqlite:///{path}"
    return create_database(request.getfixturevalue("postgres_server"), f"t_{uuid.uuid4().hex[:12]}", template=template)


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite file migrated to head once per session (and xdist worker); each test copies it."""
    path = tmp_path_factory.mktemp("template") / "ledger.db"
    command.upgrade(alembic_config(f"sqlite:///{path}"), "head")
    return str(path)


@pytest.fixture(scope="session")
def migrated_postgres(postgres_server: str) -> str:
    """A PostgreSQL database migrated to head once per session; each test's database is a copy of it."""
    name = f"template_{uuid.uuid4().hex[:12]}"
    command.upgrade(alembic_config(create_database(postgres_server, name)), "head")
    return name


def _with_fresh_audience(url: str) -> str:
    """Every ledger gets its own audience at migration; a copy of the template gets one too."""
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE deployment SET value = :value WHERE key = 'audience'"), {"value": f"intellect-{uuid.uuid4()}"}
        )
    engine.dispose()
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, unmigrated database of each kind."""
    return _new_database(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each kind at head: a copy of the session's migrated template (the
    migrations themselves are tested from an empty database in ``test_migrations``)."""
    template = request.getfixturevalue(f"migrated_{request.param}")
    return _with_fresh_audience(_new_database(request.param, request, tmp_path, template))


ON_POSTGRES_ONLY = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
"""For a long scenario whose queries shorter tests already run on both kinds: PostgreSQL alone, the ledger
of production and the stricter of the two (CI's 15 minutes)."""


@pytest.fixture
def sqlite_url(tmp_path: Path, migrated_sqlite: str) -> str:
    shutil.copyfile(migrated_sqlite, tmp_path / "ledger.db")
    return _with_fresh_audience(f"sqlite:///{tmp_path / 'ledger.db'}")


@dataclass
class Served:
    url: str
    settings: CoordinatorSettings
    engine: Engine
    audience: str

    def snapshot(self) -> dict[str, list[tuple]]:
        """Every row of every table, to prove a rejected request changed nothing."""
        with self.engine.connect() as connection:
            return {
                table: sorted(map(tuple, connection.execute(text(f"SELECT * FROM {table}"))), key=repr)
                for table in inspect(connection).get_table_names()
            }


@contextmanager
def serve(settings: CoordinatorSettings, tls: ServerFiles | None = None, clock: Clock = system_clock) -> Iterator[Served]:
    """A real coordinator: uvicorn on a free loopback port, in a thread of this process (HTTPS with ``tls``;
    ``clock``: the ledger's, e.g. a :class:`tests.support.clock.MovableClock`)."""
    app = create_app(settings, clock)
    port = free_port()
    https = server_tls(tls.cert, tls.key) if tls else {}
    config = server_config(app, "127.0.0.1", port, settings.limits.header_limits, log_level="warning", lifespan="on", tls=https)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("coordinator did not start")
        time.sleep(0.02)
    engine = make_engine(settings.database_url)
    try:
        yield Served(url, settings, engine, app.state.context.audience)
    finally:
        server.should_exit = True
        thread.join(15)
        engine.dispose()


FAST = {"heartbeat_interval_s": 0.5, "status_loop_interval_s": 0.2}
"""Timings that let status transitions happen within a test's patience."""

LIFTED = {"rate_limit_per_s": 1000, "rate_limit_burst": 1000, "newcomer_uploads_per_s": 1000}
"""Rate limits and the newcomers' pace lifted, for a test that sends more than one node would (a test of a limit
sets its own)."""


@pytest.fixture
def coordinator(database_url: str, tmp_path: Path) -> Iterator[Served]:
    """A coordinator on each database kind, with a generous rate limit."""
    settings = CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        yield served


@pytest.fixture
def account():
    return Account.create()


def admin_token(served: Served, scope: str = "admin") -> str:
    from datetime import UTC, datetime

    from intellect_protocol.coordinator.db import make_sessionmaker
    from intellect_protocol.coordinator.services.admin_tokens import create_token

    with make_sessionmaker(served.engine).begin() as session:
        return create_token(session, f"test-{scope}", scope, datetime.now(UTC))[1]


@pytest.fixture(scope="session")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small metagenomic example (:data:`tests.support.metagenome.SMALL`): a corpus, tokenizer and model, made
    once a worker and only read by the tests."""
    import torch

    from intellect_protocol.shared.pretraining.metagenome import make
    from tests.support.metagenome import SMALL

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("metagenome")
    make(out, SMALL)
    return out
