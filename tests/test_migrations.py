"""Alembic migrations on both databases, and the coordinator's refusal to run unmigrated."""

from __future__ import annotations

import subprocess

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect

from coordinator.app import create_app
from coordinator.db import (
    NotMigratedError,
    alembic_config,
    current_revision,
    head_revision,
    normalize_database_url,
)
from coordinator.settings import CoordinatorSettings

TABLES = {"deployment", "nodes", "node_status_events", "nonces", "admin_tokens"}


def test_upgrade_then_downgrade(empty_database_url: str) -> None:
    engine = create_engine(normalize_database_url(empty_database_url))
    config = alembic_config(empty_database_url)
    command.upgrade(config, "head")
    assert current_revision(engine) == head_revision()
    assert TABLES <= set(inspect(engine).get_table_names())
    command.downgrade(config, "base")
    assert current_revision(engine) is None
    assert not TABLES & set(inspect(engine).get_table_names())
    command.upgrade(config, "head")  # and back up again, cleanly
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_models_match_migrations(database_url: str) -> None:
    """Autogenerate finds nothing to add: the ORM models and the migrations agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    import coordinator.settlement_models  # noqa: F401
    import coordinator.shardcast_models  # noqa: F401
    from coordinator.models import Base

    engine = create_engine(normalize_database_url(database_url))
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []


def test_app_refuses_unmigrated_database(empty_database_url: str) -> None:
    with pytest.raises(NotMigratedError, match="intellect-coordinator migrate"):
        create_app(CoordinatorSettings(database_url=empty_database_url))


def test_serve_says_which_command_to_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    result = subprocess.run(
        ["intellect-coordinator", "serve", "--database-url", url, "--port", "1"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert f"intellect-coordinator migrate --database-url '{url}'" in result.stderr
    assert "Traceback" not in result.stderr
    migrated = subprocess.run(
        ["intellect-coordinator", "migrate", "--database-url", url], capture_output=True, text=True, timeout=60
    )
    assert migrated.returncode == 0, migrated.stderr
    assert current_revision(create_engine(url)) == head_revision()
