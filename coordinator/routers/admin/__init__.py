"""Operator endpoints under ``/v1/admin``, behind bearer tokens with scopes (read < operate < admin).

Every endpoint that changes something writes an audit entry in the same transaction.
"""

from fastapi import APIRouter

from intellect_protocol.coordinator.routers.admin import ledger, nodes, roles, runs, submissions, tokens

router = APIRouter()
for module in (nodes, runs, submissions, roles, tokens, ledger):
    router.include_router(module.router)
