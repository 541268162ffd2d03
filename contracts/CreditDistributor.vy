# pragma version 0.4.3
# pragma evm-version cancun
"""
@title Credit distributor
@notice Posters (the coordinator's sender) append, per epoch, the Merkle root of every address's
        cumulative final credit. Anyone claims, for an address, the difference between its
        cumulative amount in the latest root and what it has already claimed. Roots only append
        and epochs strictly increase, so no root is ever replaced or replayed.

        Leaf: keccak256(keccak256(abi_encode(account, cumulative))); inner node: keccak256 of its
        two children, the smaller first (so a proof needs no positions).
"""

interface ERC20:
    def transfer(receiver: address, amount: uint256) -> bool: nonpayable

event RootPosted:
    epoch: indexed(uint256)
    root: bytes32

event Claimed:
    account: indexed(address)
    epoch: indexed(uint256)
    amount: uint256
    cumulative: uint256

event PosterSet:
    account: indexed(address)
    enabled: bool

MAX_DEPTH: constant(uint256) = 64

TOKEN: public(immutable(address))
admin: public(address)
posters: public(HashMap[address, bool])
latest_epoch: public(uint256)
roots: public(HashMap[uint256, bytes32])
claimed: public(HashMap[address, uint256])


@deploy
def __init__(token: address):
    assert token != empty(address), "no token"
    TOKEN = token
    self.admin = msg.sender


@external
def set_poster(account: address, enabled: bool):
    assert msg.sender == self.admin, "only the admin sets posters"
    self.posters[account] = enabled
    log PosterSet(account=account, enabled=enabled)


@external
def post_root(epoch: uint256, root: bytes32):
    assert self.posters[msg.sender], "only a poster posts roots"
    assert epoch > self.latest_epoch, "epoch not after the latest"
    assert root != empty(bytes32), "empty root"
    self.roots[epoch] = root
    self.latest_epoch = epoch
    log RootPosted(epoch=epoch, root=root)


@view
@external
def claimable(account: address, cumulative: uint256, proof: DynArray[bytes32, MAX_DEPTH]) -> uint256:
    """What ``claim`` would pay now (0 if the proof does not match the latest root)."""
    if self._root_of(account, cumulative, proof) != self.roots[self.latest_epoch]:
        return 0
    if cumulative <= self.claimed[account]:
        return 0
    return cumulative - self.claimed[account]


@external
def claim(account: address, cumulative: uint256, proof: DynArray[bytes32, MAX_DEPTH]) -> uint256:
    """Pay ``account`` its cumulative amount in the latest root less what it already claimed."""
    epoch: uint256 = self.latest_epoch
    assert epoch > 0, "no root posted"
    assert self._root_of(account, cumulative, proof) == self.roots[epoch], "proof does not match the latest root"
    already: uint256 = self.claimed[account]
    assert cumulative > already, "nothing to claim"
    self.claimed[account] = cumulative
    assert extcall ERC20(TOKEN).transfer(account, cumulative - already), "token transfer failed"
    log Claimed(account=account, epoch=epoch, amount=cumulative - already, cumulative=cumulative)
    return cumulative - already


@pure
@internal
def _root_of(account: address, cumulative: uint256, proof: DynArray[bytes32, MAX_DEPTH]) -> bytes32:
    node: bytes32 = keccak256(keccak256(abi_encode(account, cumulative)))
    for sibling: bytes32 in proof:
        if convert(node, uint256) < convert(sibling, uint256):
            node = keccak256(concat(node, sibling))
        else:
            node = keccak256(concat(sibling, node))
    return node
