"""Roles, policy-step manifests, relays and relay reports.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "roles",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("address", sa.String(42), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("granted_by", sa.String(128), nullable=False),
        sa.Column("granted_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_roles_address_role", "roles", ["address", "role"])
    op.create_table(
        "manifests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("signer", sa.String(42), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("run_id", "step"),
    )
    op.create_table(
        "relays",
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("url", sa.String(512), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("registered_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "relay_reports",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("relay_url", sa.String(512), nullable=False, index=True),
        sa.Column("reporter", sa.String(42), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("relay_reports")
    op.drop_table("relays")
    op.drop_table("manifests")
    op.drop_index("ix_roles_address_role", table_name="roles")
    op.drop_table("roles")
