"""Alembic migrations on both databases, and the coordinator's refusal to run unmigrated."""

from __future__ import annotations

import subprocess

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect

from intellect_protocol.coordinator.app import create_app
from intellect_protocol.coordinator.db import (
    NotMigratedError,
    alembic_config,
    current_revision,
    head_revision,
    normalize_database_url,
)
from intellect_protocol.coordinator.settings import CoordinatorSettings

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

    import intellect_protocol.coordinator.audit_models  # noqa: F401
    import intellect_protocol.coordinator.island_models  # noqa: F401
    import intellect_protocol.coordinator.settlement_models  # noqa: F401
    import intellect_protocol.coordinator.shardcast_models  # noqa: F401
    from intellect_protocol.coordinator.models import Base

    engine = create_engine(normalize_database_url(database_url))
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []


def test_app_refuses_unmigrated_database(empty_database_url: str) -> None:
    with pytest.raises(NotMigratedError, match="intellect-coordinator migrate"):
        create_app(CoordinatorSettings(database_url=empty_database_url))


def test_serve_says_which_command_to_run(tmp_path) -> None:
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


def test_float_money_converts_exactly(empty_database_url: str) -> None:
    """Float credit (with the noise the page once showed) and a float minimum stake become exact integers."""
    from sqlalchemy import text

    engine = create_engine(normalize_database_url(empty_database_url))
    config = alembic_config(empty_database_url)
    command.upgrade(config, "0011")
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO runs (id, name, environment, model, sampling, prompts_per_task, samples_per_prompt, length_budget, "
                "policy_step, next_prompt, status, created_at, async_level, min_stake, trainer_cursor) VALUES ('r', 'r', 'arithmetic', "
                "'m', '{}', 1, 1, '{}', 0, 0, 'active', '2026-01-01', 2, 12.5, 0)"
            )
        )
        c.execute(
            text(
                "INSERT INTO nodes (address, specs, client_version, status, first_seen, last_seen, status_changed_at, strikes) "
                "VALUES ('0xa', '{}', '0.1', 'healthy', '2026-01-01', '2026-01-01', '2026-01-01', 0)"
            )
        )
        c.execute(
            text(
                "INSERT INTO tasks (id, run_id, prompt_ids, seed, policy_step, status, created_at) VALUES ('t', 'r', '{}', 1, 0, 'submitted', '2026-01-01')"
            )
        )
        c.execute(
            text(
                "INSERT INTO submissions (id, task_id, run_id, address, sha256, blob_key, rows, tokens, status, created_at, prompt_tokens) "
                "VALUES ('s', 't', 'r', '0xa', 'h', 'k', 1, 1, 'accepted', '2026-01-01', 0)"
            )
        )
        for units in (85932.4000000001, -0.1, 3.0000004):
            c.execute(
                text(
                    "INSERT INTO contributions (address, submission_id, kind, units, reason, created_at, final_at) "
                    "VALUES ('0xa', 's', 'credit', :u, '', '2026-01-01', '2026-01-01')"
                ),
                {"u": units},
            )
    command.upgrade(config, "head")
    with engine.connect() as c:
        assert [row[0] for row in c.execute(text("SELECT units FROM contributions ORDER BY id"))] == [
            85932400000,
            -100000,
            3000000,
        ]
        assert c.execute(text("SELECT min_stake FROM runs")).scalar_one() == str(12 * 10**18 + 5 * 10**17)
    engine.dispose()
