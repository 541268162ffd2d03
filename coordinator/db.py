"""Engines, sessions and the migration gate for the ledger.

SQLite runs in WAL mode and every transaction begins ``IMMEDIATE``, so a read transaction
never has to upgrade to a write lock (which SQLite answers with an immediate "busy"). Within
one process, transactions also queue on a lock: SQLite's own busy handler waits by sleeping
up to 100 ms at a time, which under load costs far more than the transactions themselves.
Other processes on the same file still meet the busy timeout. PostgreSQL goes through psycopg 3.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from intellect_protocol import migrations
from intellect_protocol.coordinator.db_errors import check_url
from intellect_protocol.coordinator.models import Deployment

SQLITE_BUSY_TIMEOUT_S = 30


class NotMigratedError(RuntimeError):
    """The database's schema is not at the head revision this code expects."""


def normalize_database_url(url: str) -> str:
    """Point bare ``postgresql://`` / ``postgres://`` URLs at the psycopg 3 driver we ship."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    """An engine for ``url``; :class:`coordinator.db_errors.DatabaseError` if it can never work."""
    url = normalize_database_url(url)
    check_url(url)
    if not url.startswith("sqlite"):
        return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)

    engine = create_engine(
        url,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False, "isolation_level": None},
        pool_size=8,
        max_overflow=16,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: object) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    write_lock = threading.Lock()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        write_lock.acquire()
        try:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            write_lock.release()
            raise
        connection.info["holds_write_lock"] = True

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _on_end(connection: Connection) -> None:
        if connection.info.pop("holds_write_lock", False):
            write_lock.release()

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # Passed as an attribute, not an ini option, so '%' in passwords needs no escaping.
    config.attributes["database_url"] = normalize_database_url(url)
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def require_migrated(engine: Engine, url: str) -> None:
    """Raise :class:`NotMigratedError`, naming the command to run, unless the schema is at head."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise NotMigratedError(
            f"The database is at revision {current or 'none (empty)'} but this coordinator needs {head}. "
            f"Run: intellect-coordinator migrate --database-url '{url}'"
        )


def read_audience(session: Session) -> str:
    audience = session.scalar(select(Deployment.value).where(Deployment.key == "audience"))
    if audience is None:
        raise NotMigratedError("The deployment table has no audience id; run intellect-coordinator migrate.")
    return audience
