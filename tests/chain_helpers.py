"""A real EVM in-process (py-evm through web3's tester provider), with funded local keys."""

from __future__ import annotations

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import EthereumTesterProvider, Web3

from intellect_protocol.shared.chain import Settlement

UNBONDING_S = 3600
from intellect_protocol.shared.money import TOKEN


def evm_chain() -> Web3:
    return Web3(EthereumTesterProvider())


def funded(w3: Web3, eth: int = 10) -> LocalAccount:
    account: LocalAccount = Account.create()
    tx = w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": account.address, "value": eth * 10**18})
    w3.eth.wait_for_transaction_receipt(tx)
    return account


def advance(w3: Web3, seconds: int) -> None:
    """Move the chain's clock forward (one block at the new time)."""
    tester = w3.provider.ethereum_tester
    tester.time_travel(w3.eth.get_block("latest")["timestamp"] + seconds)
    tester.mine_blocks(1)


def deployed(w3: Web3, admin: LocalAccount) -> Settlement:
    return Settlement.deploy(w3, admin, unbonding_s=UNBONDING_S, reward_supply=1_000_000 * TOKEN)
