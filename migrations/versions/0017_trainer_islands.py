"""Trainer islands: each run's islands and the accepted submissions each holds, and the run's outer-step
settings (NULL: the defaults).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("outer", sa.JSON(), nullable=True))
    op.create_table(
        "islands",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(42), nullable=False),
        sa.Column("joined_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.Column("outer_step", sa.Integer(), nullable=False),
        sa.Column("excluded_steps", sa.Integer(), nullable=False),
        sa.Column("last_exclusion", sa.Text(), nullable=True),
    )
    op.create_table(
        "island_shares",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("cursor", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("island", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
        sa.Column("outer_step", sa.Integer(), nullable=True),
        sa.Column("attempt", sa.String(32), nullable=True),
    )
    op.create_index("ix_island_shares_run_island_state", "island_shares", ["run_id", "island", "state"])


def downgrade() -> None:
    op.drop_index("ix_island_shares_run_island_state", "island_shares")
    op.drop_table("island_shares")
    op.drop_table("islands")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("outer")
