"""Island audits are drawn for a validator: only the one drawn may replay and judge an audit, so no validator picks
the audits it judges.

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


def downgrade() -> None:
    with op.batch_alter_table("island_audits") as batch:
        batch.drop_column("assigned_at")
        batch.drop_column("assignee")
