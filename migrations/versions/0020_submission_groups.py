"""Each submission's groups, those without a reward spread, and its task rewards' sum: the run's learning signal.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.add_column(sa.Column("groups", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("flat_groups", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("task_reward_sum", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.drop_column("task_reward_sum")
        batch.drop_column("flat_groups")
        batch.drop_column("groups")
