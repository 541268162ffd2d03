"""The credit tree anchored on chain each epoch, exactly as ``contracts/CreditDistributor.vy`` checks it.

A leaf is ``keccak256(keccak256(abi_encode(address, cumulative)))`` (hashed twice, so no inner
node can pass for a leaf); an inner node hashes its two children, the smaller first, so a proof
is just the list of siblings. Leaves are ordered by address and an odd node moves up unpaired:
anyone holding the same amounts builds the same root.
"""

from __future__ import annotations

from eth_utils import keccak, to_canonical_address


def leaf(address: str, cumulative: int) -> bytes:
    if not 0 <= cumulative < 1 << 256:
        raise ValueError(f"cumulative amount {cumulative} is not a uint256")
    encoded = to_canonical_address(address).rjust(32, b"\0") + cumulative.to_bytes(32, "big")
    return keccak(keccak(encoded))


def parent(a: bytes, b: bytes) -> bytes:
    return keccak(a + b) if a < b else keccak(b + a)


class CreditTree:
    """The Merkle tree over ``{address: cumulative amount}`` (at least one address)."""

    def __init__(self, amounts: dict[str, int]) -> None:
        if not amounts:
            raise ValueError("a credit tree needs at least one address")
        self.addresses = sorted(amounts, key=str.lower)
        self._index = {a.lower(): i for i, a in enumerate(self.addresses)}
        self.layers = [[leaf(a, amounts[a]) for a in self.addresses]]
        while len(self.layers[-1]) > 1:
            below = self.layers[-1]
            above = [parent(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)]
            if len(below) % 2:
                above.append(below[-1])
            self.layers.append(above)

    @property
    def root(self) -> bytes:
        return self.layers[-1][0]

    def proof(self, address: str) -> list[bytes]:
        """Siblings from ``address``'s leaf up to the root."""
        index = self._index[address.lower()]
        siblings = []
        for layer in self.layers[:-1]:
            sibling = index ^ 1
            if sibling < len(layer):
                siblings.append(layer[sibling])
            index //= 2
        return siblings


def root_of(address: str, cumulative: int, proof: list[bytes]) -> bytes:
    """The root a claim with this proof reaches (the contract compares it with the latest root)."""
    node = leaf(address, cumulative)
    for sibling in proof:
        node = parent(node, sibling)
    return node
