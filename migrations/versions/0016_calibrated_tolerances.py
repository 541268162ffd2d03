"""A run's tolerances, calibrated on its own model, by the numerics it admits (NULL: uncalibrated).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("tolerances", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("tolerances")
