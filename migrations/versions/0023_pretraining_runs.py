"""Pretraining runs: a run's kind, and for a pretraining run its corpus manifest and inner-step settings.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="rl"))
        batch.add_column(sa.Column("corpus", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("pretrain", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("pretrain")
        batch.drop_column("corpus")
        batch.drop_column("kind")
