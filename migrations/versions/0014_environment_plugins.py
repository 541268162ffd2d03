"""Environments are plugins: a run pins the plugin's ``package==version``.

Every run before this one used a built-in environment of this package's only release.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("environment_version", sa.String(256), nullable=False, server_default="intellect-protocol==0.1.0")
        )
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("environment_version", existing_type=sa.String(256), server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("environment_version")
