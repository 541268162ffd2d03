"""Audits of pretraining islands: the order each report learnt its claims in (and, overlapped, what its round started
from), and the audits drawn of published steps with the validators' votes on them.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("island_shares") as batch:
        batch.add_column(sa.Column("position", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("start_digest", sa.String(64), nullable=True))
    op.create_table(
        "island_audits",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("outer_step", sa.Integer(), nullable=False),
        sa.Column("island", sa.String(64), nullable=False),
        sa.Column("address", sa.String(42), nullable=False),
        sa.Column("attempt", sa.String(32), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("blob_key", sa.String(200), nullable=True),
        sa.Column("drawn_at", sa.DateTime(), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("start_audit_id", sa.Integer(), sa.ForeignKey("island_audits.id"), nullable=True),
        sa.UniqueConstraint("run_id", "outer_step", "island"),
    )
    op.create_index("ix_island_audits_state", "island_audits", ["state"])
    op.create_table(
        "island_audit_votes",
        sa.Column("audit_id", sa.Integer(), sa.ForeignKey("island_audits.id"), primary_key=True),
        sa.Column("validator", sa.String(42), primary_key=True),
        sa.Column("relative_error", sa.Float(), nullable=False),
        sa.Column("cosine", sa.Float(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("island_audit_votes")
    op.drop_index("ix_island_audits_state", "island_audits")
    op.drop_table("island_audits")
    with op.batch_alter_table("island_shares") as batch:
        batch.drop_column("start_digest")
        batch.drop_column("position")
