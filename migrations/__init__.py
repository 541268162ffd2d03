"""Alembic environment and versions: the only way the ledger's schema changes."""
