"""Who is not independent of whom: a validator never judges work of an address it is linked to."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import Node
from intellect_protocol.coordinator.settings import CoordinatorSettings


def linked(session: Session, address: str, settings: CoordinatorSettings) -> set[str]:
    """Addresses ``address`` is not independent of: itself, the nodes it operates, its operator and
    that operator's other nodes, and any group of ``settings.linked_addresses`` it is in. Operator
    links exist only with the operator's signature (:func:`coordinator.services.nodes.register`)."""
    node = session.get(Node, address)
    operators = {address} | ({node.operator_address} if node is not None and node.operator_address else set())
    out = operators | set(session.scalars(select(Node.address).where(Node.operator_address.in_(operators))))
    for group in settings.linked_addresses:
        if address in group:
            out |= set(group)
    return out
