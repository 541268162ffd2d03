"""Alembic environment: the URL comes from the caller (``intellect-coordinator migrate``) or env."""

import os

from alembic import context
from sqlalchemy import create_engine, pool

import intellect_protocol.coordinator.audit_models  # noqa: F401  (its tables join Base.metadata)
import intellect_protocol.coordinator.island_models  # noqa: F401  (its tables join Base.metadata)
import intellect_protocol.coordinator.settlement_models  # noqa: F401  (its tables join Base.metadata)
import intellect_protocol.coordinator.shardcast_models  # noqa: F401  (its tables join Base.metadata)
from intellect_protocol.coordinator.models import Base

config = context.config
url = config.attributes.get("database_url") or os.environ.get("INTELLECT_DATABASE_URL", "sqlite:///intellect.db")
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        engine = create_engine(url, poolclass=pool.NullPool)
        with engine.connect() as connection:
            _run(connection)
        engine.dispose()
    else:
        _run(connectable)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    # Batch mode lets ALTERs work on SQLite, which rebuilds tables for them.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
