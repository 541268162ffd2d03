"""Operations: the admin audit log, operator evaluations, per-run dispute window, task settings snapshots.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("token_name", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(128), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False, index=True),
    )
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("run_id", "step"),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("dispute_window_s", sa.Float(), nullable=True))
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("params", sa.JSON(), nullable=True))
    op.create_index("ix_contributions_created_at", "contributions", ["created_at"])
    op.create_index("ix_submissions_run_created", "submissions", ["run_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_submissions_run_created", "submissions")
    op.drop_index("ix_contributions_created_at", "contributions")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("params")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("dispute_window_s")
    op.drop_table("evaluations")
    op.drop_table("audit_log")
