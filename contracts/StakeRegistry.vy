# pragma version 0.4.3
# pragma evm-version cancun
"""
@title Stake registry
@notice Nodes stake an ERC-20 to join runs. Leaving takes an unbonding delay, during which the
        stake can still be slashed: a cheater cannot withdraw ahead of the penalty. Addresses
        holding the slasher role (the coordinator's sender) slash, citing the evidence's hash;
        slashed tokens go to the beneficiary (e.g. the credit distributor, funding honest work).
        Roles come from snekmate's audited access control.
"""

from ethereum.ercs import IERC165
implements: IERC165

from snekmate.auth.interfaces import IAccessControl
implements: IAccessControl

from snekmate.auth import access_control
initializes: access_control
exports: access_control.__interface__

interface ERC20:
    def transfer(receiver: address, amount: uint256) -> bool: nonpayable
    def transferFrom(owner: address, receiver: address, amount: uint256) -> bool: nonpayable

event Staked:
    account: indexed(address)
    amount: uint256

event UnstakeRequested:
    account: indexed(address)
    amount: uint256
    withdrawable_at: uint256

event Withdrawn:
    account: indexed(address)
    amount: uint256

event Slashed:
    account: indexed(address)
    amount: uint256
    evidence: bytes32
    slasher: address

SLASHER_ROLE: public(constant(bytes32)) = keccak256("SLASHER_ROLE")

TOKEN: public(immutable(address))
UNBONDING_S: public(immutable(uint256))
beneficiary: public(address)
staked: public(HashMap[address, uint256])
unbonding: public(HashMap[address, uint256])
withdrawable_at: public(HashMap[address, uint256])
slashed: public(HashMap[address, uint256])


@deploy
def __init__(token: address, unbonding_s: uint256, beneficiary: address):
    assert token != empty(address), "no token"
    assert beneficiary != empty(address), "no beneficiary"
    access_control.__init__()
    TOKEN = token
    UNBONDING_S = unbonding_s
    self.beneficiary = beneficiary


@external
def stake(amount: uint256):
    assert amount > 0, "stake nothing"
    assert extcall ERC20(TOKEN).transferFrom(msg.sender, self, amount), "token transfer failed"
    self.staked[msg.sender] += amount
    log Staked(account=msg.sender, amount=amount)


@external
def request_unstake(amount: uint256):
    """Move stake into unbonding; the whole unbonding amount waits the full delay from now."""
    assert amount > 0, "unstake nothing"
    assert self.staked[msg.sender] >= amount, "stake too low"
    self.staked[msg.sender] -= amount
    self.unbonding[msg.sender] += amount
    until: uint256 = block.timestamp + UNBONDING_S
    self.withdrawable_at[msg.sender] = until
    log UnstakeRequested(account=msg.sender, amount=amount, withdrawable_at=until)


@external
def withdraw() -> uint256:
    amount: uint256 = self.unbonding[msg.sender]
    assert amount > 0, "nothing unbonding"
    assert block.timestamp >= self.withdrawable_at[msg.sender], "still unbonding"
    self.unbonding[msg.sender] = 0
    assert extcall ERC20(TOKEN).transfer(msg.sender, amount), "token transfer failed"
    log Withdrawn(account=msg.sender, amount=amount)
    return amount


@external
def slash(account: address, amount: uint256, evidence: bytes32) -> uint256:
    """Take up to ``amount`` from the account's stake, active first, then unbonding; returns what was taken."""
    access_control._check_role(SLASHER_ROLE, msg.sender)
    from_staked: uint256 = min(amount, self.staked[account])
    from_unbonding: uint256 = min(amount - from_staked, self.unbonding[account])
    taken: uint256 = from_staked + from_unbonding
    assert taken > 0, "nothing to slash"
    self.staked[account] -= from_staked
    self.unbonding[account] -= from_unbonding
    self.slashed[account] += taken
    assert extcall ERC20(TOKEN).transfer(self.beneficiary, taken), "token transfer failed"
    log Slashed(account=account, amount=taken, evidence=evidence, slasher=msg.sender)
    return taken
