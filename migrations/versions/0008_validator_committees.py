"""Validator committees: reviews (assignments and verdicts), appeals, node and validator strikes as
rows, a run's audit policy, restorable clawbacks, and validator liveness.

Existing verdicts become first reviews; pending submissions get an open first review; a node's
strike count becomes one row, so ``nodes.strikes`` stays the sum of ``node_strikes``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "appeals",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("submission_id", sa.String(64), sa.ForeignKey("submissions.id"), nullable=False, unique=True),
        sa.Column("address", sa.String(42), nullable=False, index=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("prior_outcome", sa.String(8), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False, index=True),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
    )
    op.create_table(
        "reviews",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("submission_id", sa.String(64), sa.ForeignKey("submissions.id"), nullable=False, index=True),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("appeal_id", sa.Integer(), sa.ForeignKey("appeals.id"), nullable=True),
        sa.Column("opened_at", sa.DateTime(), nullable=False),
        sa.Column("validator", sa.String(42), nullable=True, index=True),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("claimed_at", sa.DateTime(), nullable=True),
        sa.Column("outcome", sa.String(8), nullable=True),
        sa.Column("checks", sa.JSON(), nullable=True),
        sa.Column("untrained_rows", sa.JSON(), nullable=True),
        sa.Column("signature", sa.String(132), nullable=True),
        sa.Column("judged_at", sa.DateTime(), nullable=True),
        sa.Column("agreed", sa.Boolean(), nullable=True),
        sa.Column("voided_at", sa.DateTime(), nullable=True),
        sa.Column("void_reason", sa.Text(), nullable=True),
    )
    op.create_index("ix_reviews_open", "reviews", ["outcome", "validator"])
    op.create_table(
        "node_strikes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("address", sa.String(42), nullable=False, index=True),
        sa.Column("submission_id", sa.String(64), nullable=True, index=True),
        sa.Column("units", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "validator_strikes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("validator", sa.String(42), nullable=False, index=True),
        sa.Column("submission_id", sa.String(64), sa.ForeignKey("submissions.id"), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("audit", sa.JSON(), nullable=True))
    with op.batch_alter_table("roles") as batch:
        batch.add_column(sa.Column("revoke_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("last_seen", sa.DateTime(), nullable=True))
    with op.batch_alter_table("contributions") as batch:
        batch.add_column(sa.Column("cause_id", sa.String(64), nullable=True))
        batch.create_index("ix_contributions_cause_id", ["cause_id"])
    with op.batch_alter_table("submissions") as batch:
        batch.add_column(sa.Column("outcome", sa.String(8), nullable=True))

    op.execute(
        "UPDATE submissions SET outcome = CASE WHEN status IN ('accepted', 'invalidated') THEN 'accept' "
        "WHEN hard THEN 'hard' ELSE 'soft' END WHERE validator IS NOT NULL"
    )
    op.execute(
        "INSERT INTO reviews (submission_id, purpose, opened_at, validator, outcome, checks, untrained_rows, signature, judged_at) "
        "SELECT id, 'first', created_at, validator, outcome, checks, untrained_rows, verdict_signature, validated_at "
        "FROM submissions WHERE validator IS NOT NULL"
    )
    op.execute(
        "INSERT INTO reviews (submission_id, purpose, opened_at) SELECT id, 'first', created_at FROM submissions WHERE status = 'pending'"
    )
    op.execute(
        "INSERT INTO node_strikes (address, units, reason, at) "
        "SELECT address, strikes, 'strikes given before strikes were recorded one by one', status_changed_at FROM nodes WHERE strikes > 0"
    )
    with op.batch_alter_table("submissions") as batch:
        batch.drop_column("claimed_by")
        batch.drop_column("claim_expires_at")


def downgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.add_column(sa.Column("claimed_by", sa.String(42), nullable=True))
        batch.add_column(sa.Column("claim_expires_at", sa.DateTime(), nullable=True))
        batch.drop_column("outcome")
    with op.batch_alter_table("contributions") as batch:
        batch.drop_index("ix_contributions_cause_id")
        batch.drop_column("cause_id")
    with op.batch_alter_table("roles") as batch:
        batch.drop_column("last_seen")
        batch.drop_column("revoke_reason")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("audit")
    op.drop_table("validator_strikes")
    op.drop_table("node_strikes")
    op.drop_index("ix_reviews_open", table_name="reviews")
    op.drop_table("reviews")
    op.drop_table("appeals")
