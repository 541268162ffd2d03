"""Validation claims and verdicts on submissions, strikes, run staleness, contribution entries.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def submission_columns() -> list[sa.Column]:
    return [
        sa.Column("prompt_tokens", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("claimed_by", sa.String(42), nullable=True),
        sa.Column("claim_expires_at", sa.DateTime(), nullable=True),
        sa.Column("validator", sa.String(42), nullable=True),
        sa.Column("checks", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("hard", sa.Boolean(), nullable=True),
        sa.Column("validated_at", sa.DateTime(), nullable=True),
    ]


def upgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        for column in submission_columns():
            batch.add_column(column)
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("strikes", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("async_level", sa.Integer(), nullable=False, server_default="2"))
    op.create_table(
        "contributions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("address", sa.String(42), nullable=False, index=True),
        sa.Column("submission_id", sa.String(64), sa.ForeignKey("submissions.id"), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("units", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("final_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("contributions")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("async_level")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("strikes")
    with op.batch_alter_table("submissions") as batch:
        for column in reversed(submission_columns()):
            batch.drop_column(column.name)
