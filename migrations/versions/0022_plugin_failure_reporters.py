"""A run paused for its reward's failures needs them from several nodes: who reported, counted per node.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plugin_failure_reporters",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("failures", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("plugin_failure_reporters")
