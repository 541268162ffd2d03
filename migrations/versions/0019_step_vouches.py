"""Trainer islands vouch for each policy step's content, publisher and record before it is published and settled.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_vouches",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("step", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("island", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(42), nullable=False),
        sa.Column("content", sa.String(64), nullable=False),
        sa.Column("publisher", sa.String(64), nullable=False),
        sa.Column("record", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("step_vouches")
