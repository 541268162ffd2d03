"""Money is integers: ledger entries in credit micro-units, runs' minimum stake in token base units.

Existing rows convert exactly: a float entry is rounded to the micro-unit (the precision the
anchored roots always used), a float minimum stake becomes base units through its decimal repr.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from decimal import Decimal

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

MICRO = 10**6
TOKEN = 10**18


def upgrade() -> None:
    op.add_column("contributions", sa.Column("units_micro", sa.BigInteger(), nullable=True))
    op.execute(f"UPDATE contributions SET units_micro = CAST(ROUND(units * {MICRO}) AS BIGINT)")
    op.add_column("runs", sa.Column("min_stake_base", sa.String(80), nullable=True))
    connection = op.get_bind()
    for run_id, stake in connection.execute(sa.text("SELECT id, min_stake FROM runs")).all():
        base = int(Decimal(repr(float(stake or 0))) * TOKEN)
        connection.execute(sa.text("UPDATE runs SET min_stake_base = :b WHERE id = :i"), {"b": str(base), "i": run_id})
    with op.batch_alter_table("contributions") as batch:
        batch.drop_column("units")
        batch.alter_column("units_micro", new_column_name="units", existing_type=sa.BigInteger(), nullable=False)
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("min_stake")
        batch.alter_column(
            "min_stake_base", new_column_name="min_stake", existing_type=sa.String(80), nullable=False, server_default="0"
        )


def downgrade() -> None:
    op.add_column("contributions", sa.Column("units_float", sa.Float(), nullable=True))
    op.execute(f"UPDATE contributions SET units_float = units / {float(MICRO)!r}")
    op.add_column("runs", sa.Column("min_stake_float", sa.Float(), nullable=True))
    connection = op.get_bind()
    for run_id, stake in connection.execute(sa.text("SELECT id, min_stake FROM runs")).all():
        connection.execute(sa.text("UPDATE runs SET min_stake_float = :f WHERE id = :i"), {"f": int(stake) / TOKEN, "i": run_id})
    with op.batch_alter_table("contributions") as batch:
        batch.drop_column("units")
        batch.alter_column("units_float", new_column_name="units", existing_type=sa.Float(), nullable=False)
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("min_stake")
        batch.alter_column(
            "min_stake_float", new_column_name="min_stake", existing_type=sa.Float(), nullable=False, server_default="0"
        )
