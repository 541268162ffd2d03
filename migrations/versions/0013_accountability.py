"""Accountability under attack: signed operator links, held splits, reviews set aside when nobody
can be drawn for them, rows trained before an acceptance was reversed, and slashes of revoked
validators (a slashing names a ban or a revocation).

Operator links nobody signed no longer count: existing ones are cleared (a node that wants one
registers again with its operator's signature).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("operator_signature", sa.String(132), nullable=True))
    op.execute("UPDATE nodes SET operator_address = NULL")
    with op.batch_alter_table("submissions") as batch:
        batch.add_column(sa.Column("held_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("trained_rows", sa.Integer(), nullable=True))
    with op.batch_alter_table("reviews") as batch:
        batch.add_column(sa.Column("retry_at", sa.DateTime(), nullable=True))
        batch.create_index("ix_reviews_retry_at", ["retry_at"])
    with op.batch_alter_table("slashings") as batch:
        batch.alter_column("ban_event_id", existing_type=sa.Integer(), nullable=True)
        batch.add_column(
            sa.Column("role_id", sa.Integer(), sa.ForeignKey("roles.id", name="fk_slashings_role_id"), nullable=True)
        )
        batch.create_unique_constraint("uq_slashings_role_id", ["role_id"])


def downgrade() -> None:
    with op.batch_alter_table("slashings") as batch:
        batch.drop_constraint("uq_slashings_role_id", type_="unique")
        batch.drop_constraint("fk_slashings_role_id", type_="foreignkey")
        batch.drop_column("role_id")
    op.execute("DELETE FROM slashings WHERE ban_event_id IS NULL")
    with op.batch_alter_table("slashings") as batch:
        batch.alter_column("ban_event_id", existing_type=sa.Integer(), nullable=False)
    with op.batch_alter_table("reviews") as batch:
        batch.drop_index("ix_reviews_retry_at")
        batch.drop_column("retry_at")
    with op.batch_alter_table("submissions") as batch:
        batch.drop_column("trained_rows")
        batch.drop_column("held_at")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("operator_signature")
