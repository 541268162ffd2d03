"""Verdicts carry their validator's signature, and the rows of accepted work kept out of training
(their tokens hold a disagreement numerics explain).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.add_column(sa.Column("untrained_rows", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("verdict_signature", sa.String(132), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.drop_column("verdict_signature")
        batch.drop_column("untrained_rows")
