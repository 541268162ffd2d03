"""Settlement: each epoch's credit tree (root and leaves) and its confirmed anchor on chain, runs'
minimum stake, and the slashes that followed bans.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("min_stake", sa.Float(), nullable=False, server_default="0"))
    op.create_table(
        "slashings",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("address", sa.String(42), nullable=False, index=True),
        sa.Column("ban_event_id", sa.Integer(), sa.ForeignKey("node_status_events.id"), nullable=False, unique=True),
        sa.Column("evidence", sa.String(66), nullable=False),
        sa.Column("submissions", sa.JSON(), nullable=False),
        sa.Column("amount", sa.String(80), nullable=False),
        sa.Column("tx_hash", sa.String(66), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "epochs",
        sa.Column("epoch", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("root", sa.String(66), nullable=False),
        sa.Column("last_entry_id", sa.Integer(), nullable=False),
        sa.Column("cutoff", sa.DateTime(), nullable=False),
        sa.Column("addresses", sa.Integer(), nullable=False),
        sa.Column("total", sa.String(80), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "epoch_leaves",
        sa.Column("epoch", sa.Integer(), sa.ForeignKey("epochs.epoch"), primary_key=True),
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("cumulative", sa.String(80), nullable=False),
    )
    op.create_table(
        "epoch_anchors",
        sa.Column("epoch", sa.Integer(), sa.ForeignKey("epochs.epoch"), primary_key=True),
        sa.Column("tx_hash", sa.String(66), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("anchored_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("epoch_anchors")
    op.drop_table("epoch_leaves")
    op.drop_table("epochs")
    op.drop_table("slashings")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("min_stake")
