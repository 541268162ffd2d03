# pragma version 0.4.3
# pragma evm-version cancun
"""
@title Credit distributor
@notice Posters (the coordinator's sender) append, per epoch, the Merkle root of every address's
        cumulative final credit. Anyone claims, for an address, the difference between its
        cumulative amount in the latest root and what it has already claimed. Roots only append
        and epochs strictly increase, so no root is ever replaced or replayed.

        Each root names its cutoff: it counts only credit final at that time, and a cutoff later
        than the block that posts it is refused (that would pay credit still open to dispute).

        Leaf: keccak256(keccak256(abi_encode(account, cumulative))); inner node: keccak256 of its
        two children, the smaller first (so a proof needs no positions): the tree snekmate's
        audited Merkle proof verification checks. Roles come from snekmate's access control.
"""

from ethereum.ercs import IERC165
implements: IERC165

from snekmate.auth.interfaces import IAccessControl
implements: IAccessControl

from snekmate.auth import access_control
initializes: access_control
exports: access_control.__interface__

from snekmate.utils import merkle_proof_verification

interface ERC20:
    def transfer(receiver: address, amount: uint256) -> bool: nonpayable

event RootPosted:
    epoch: indexed(uint256)
    root: bytes32
    cutoff: uint256

event Claimed:
    account: indexed(address)
    epoch: indexed(uint256)
    amount: uint256
    cumulative: uint256

POSTER_ROLE: public(constant(bytes32)) = keccak256("POSTER_ROLE")
MAX_DEPTH: constant(uint256) = 64

TOKEN: public(immutable(address))
latest_epoch: public(uint256)
roots: public(HashMap[uint256, bytes32])
cutoffs: public(HashMap[uint256, uint256])
claimed: public(HashMap[address, uint256])


@deploy
def __init__(token: address):
    assert token != empty(address), "no token"
    access_control.__init__()
    TOKEN = token


@external
def post_root(epoch: uint256, root: bytes32, cutoff: uint256):
    """Append ``root`` of cumulative credit final at ``cutoff`` (unix seconds) as ``epoch``."""
    access_control._check_role(POSTER_ROLE, msg.sender)
    assert epoch > self.latest_epoch, "epoch not after the latest"
    assert root != empty(bytes32), "empty root"
    assert cutoff <= block.timestamp, "cutoff in the future: that credit is still open to dispute"
    assert cutoff >= self.cutoffs[self.latest_epoch], "cutoff before the latest root's"
    self.roots[epoch] = root
    self.cutoffs[epoch] = cutoff
    self.latest_epoch = epoch
    log RootPosted(epoch=epoch, root=root, cutoff=cutoff)


@view
@external
def claimable(account: address, cumulative: uint256, proof: DynArray[bytes32, MAX_DEPTH]) -> uint256:
    """What ``claim`` would pay now (0 if the proof does not match the latest root)."""
    if not self._proves(account, cumulative, proof, self.roots[self.latest_epoch]):
        return 0
    if cumulative <= self.claimed[account]:
        return 0
    return cumulative - self.claimed[account]


@external
def claim(account: address, cumulative: uint256, proof: DynArray[bytes32, MAX_DEPTH]) -> uint256:
    """Pay ``account`` its cumulative amount in the latest root less what it already claimed."""
    epoch: uint256 = self.latest_epoch
    assert epoch > 0, "no root posted"
    assert self._proves(account, cumulative, proof, self.roots[epoch]), "proof does not match the latest root"
    already: uint256 = self.claimed[account]
    assert cumulative > already, "nothing to claim"
    self.claimed[account] = cumulative
    assert extcall ERC20(TOKEN).transfer(account, cumulative - already), "token transfer failed"
    log Claimed(account=account, epoch=epoch, amount=cumulative - already, cumulative=cumulative)
    return cumulative - already


@view
@internal
def _proves(account: address, cumulative: uint256, proof: DynArray[bytes32, MAX_DEPTH], root: bytes32) -> bool:
    return merkle_proof_verification._verify(proof, root, keccak256(keccak256(abi_encode(account, cumulative))))
