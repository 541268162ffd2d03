"""Foundation: deployment facts, nodes, their status history, nonces, admin tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    deployment = op.create_table(
        "deployment",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )
    # Signatures name this id, so one made for this deployment is worthless at any other.
    op.bulk_insert(deployment, [{"key": "audience", "value": f"intellect-{uuid.uuid4()}"}])

    op.create_table(
        "nodes",
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("operator_address", sa.String(42), nullable=True),
        sa.Column("specs", sa.JSON(), nullable=False),
        sa.Column("client_version", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("ban_reason", sa.Text(), nullable=True),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("last_heartbeat", sa.JSON(), nullable=True),
        sa.Column("status_changed_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "node_status_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("address", sa.String(42), sa.ForeignKey("nodes.address"), nullable=False),
        sa.Column("from_status", sa.String(16), nullable=True),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_node_status_events_address_id", "node_status_events", ["address", "id"])
    op.create_table(
        "nonces",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("address", sa.String(42), nullable=False),
        sa.Column("nonce", sa.String(64), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False, index=True),
        sa.UniqueConstraint("address", "nonce", name="uq_nonces_address_nonce"),
    )
    op.create_table(
        "admin_tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("scopes", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("admin_tokens")
    op.drop_table("nonces")
    op.drop_index("ix_node_status_events_address_id", table_name="node_status_events")
    op.drop_table("node_status_events")
    op.drop_table("nodes")
    op.drop_table("deployment")
