"""The coordinator: FastAPI app, SQL ledger, background loops. Never imports torch."""
