"""A run's prompting: a system prompt and the chat template's thinking switch (NULL: neither).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("prompting", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("prompting")
