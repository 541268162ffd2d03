"""Island audits are drawn for a validator: only the one drawn may replay and judge an audit, so no validator picks
the audits it judges; a validator outvoted on an island audit is struck as one outvoted on a submission is.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("island_audits") as batch:
        batch.add_column(sa.Column("assignee", sa.String(42), nullable=True))
        batch.add_column(sa.Column("assigned_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("validator_strikes") as batch:
        batch.alter_column("submission_id", existing_type=sa.String(64), nullable=True)
        batch.add_column(sa.Column("island_audit_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM validator_strikes WHERE submission_id IS NULL")
    with op.batch_alter_table("validator_strikes") as batch:
        batch.drop_column("island_audit_id")
        batch.alter_column("submission_id", existing_type=sa.String(64), nullable=False)
    with op.batch_alter_table("island_audits") as batch:
        batch.drop_column("assigned_at")
        batch.drop_column("assignee")
