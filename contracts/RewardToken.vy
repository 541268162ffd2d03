# pragma version 0.4.3
# pragma evm-version cancun
"""
@title Test reward token
@notice A plain ERC-20 whose deployer may mint: devnets and tests fund stakes and rewards with it.
"""

event Transfer:
    sender: indexed(address)
    receiver: indexed(address)
    amount: uint256

event Approval:
    owner: indexed(address)
    spender: indexed(address)
    amount: uint256

name: public(String[32])
symbol: public(String[8])
decimals: public(constant(uint8)) = 18
totalSupply: public(uint256)
balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])
minter: public(address)


@deploy
def __init__(name: String[32], symbol: String[8]):
    self.name = name
    self.symbol = symbol
    self.minter = msg.sender


@external
def transfer(receiver: address, amount: uint256) -> bool:
    self._transfer(msg.sender, receiver, amount)
    return True


@external
def transferFrom(owner: address, receiver: address, amount: uint256) -> bool:
    allowed: uint256 = self.allowance[owner][msg.sender]
    assert allowed >= amount, "allowance too low"
    # The maximum allowance never runs down, as most tokens do.
    if allowed != max_value(uint256):
        self.allowance[owner][msg.sender] = allowed - amount
    self._transfer(owner, receiver, amount)
    return True


@external
def approve(spender: address, amount: uint256) -> bool:
    self.allowance[msg.sender][spender] = amount
    log Approval(owner=msg.sender, spender=spender, amount=amount)
    return True


@external
def mint(receiver: address, amount: uint256):
    assert msg.sender == self.minter, "only the minter mints"
    assert receiver != empty(address), "mint to the zero address"
    self.totalSupply += amount
    self.balanceOf[receiver] += amount
    log Transfer(sender=empty(address), receiver=receiver, amount=amount)


@internal
def _transfer(sender: address, receiver: address, amount: uint256):
    assert receiver != empty(address), "transfer to the zero address"
    assert self.balanceOf[sender] >= amount, "balance too low"
    self.balanceOf[sender] -= amount
    self.balanceOf[receiver] += amount
    log Transfer(sender=sender, receiver=receiver, amount=amount)
