"""Backpressure: the trainer's read position per run, and decisions indexed by time.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("trainer_cursor", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_submissions_run_validated", "submissions", ["run_id", "validated_at"])


def downgrade() -> None:
    op.drop_index("ix_submissions_run_validated", table_name="submissions")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trainer_cursor")
