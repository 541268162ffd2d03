"""Links between addresses count only when the linked address signed them.

A node may say which operator (a person or a pool) runs it, so a validator is never drawn to judge
work of the nodes it operates. Taken on the node's word, that would let a forger name an honest
validator as its operator and keep it out of its committee. So the operator signs the link: an
EIP-191 signature over :func:`link_text`, bound to one deployment (its audience) and one node. The
coordinator keeps a link only with that signature; an admin may add links of its own
(``linked_addresses``).
"""

from __future__ import annotations

from eth_account.signers.local import LocalAccount

from intellect_protocol.shared.signing import recover_text_signer, sign_text


def link_text(audience: str, node: str) -> str:
    return f"intellect-operator-link:{audience}:{node.lower()}"


def sign_link(operator: LocalAccount, audience: str, node: str) -> str:
    """The operator's consent to be linked with ``node`` on the deployment ``audience``."""
    return sign_text(operator, link_text(audience, node))


def link_signer(signature: str, audience: str, node: str) -> str | None:
    """Who signed this link (None: a malformed signature)."""
    try:
        return recover_text_signer(link_text(audience, node), signature)
    except ValueError:
        return None
