"""Step timing: when a task's lease and a submission's upload began, and what each policy step read.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("leased_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("submissions") as batch:
        batch.add_column(sa.Column("upload_started_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("trainer_metrics") as batch:
        batch.add_column(sa.Column("cursor", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trainer_metrics") as batch:
        batch.drop_column("cursor")
    with op.batch_alter_table("submissions") as batch:
        batch.drop_column("upload_started_at")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("leased_at")
