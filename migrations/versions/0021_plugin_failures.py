"""Runs count their environment's reward failures, and say why the coordinator paused them.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("plugin_failures", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("paused_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("paused_reason")
        batch.drop_column("plugin_failures")
