"""The settlement contracts over web3: deploy them, read them, send transactions and wait for them.

Every transaction is signed locally by the sender's own key (nodes and the coordinator never hand
a key to the RPC node); the nonce comes from the chain's pending count, so a restarted sender
carries on where it stopped. A revert, a sender without gas for the fee, or an unreachable RPC
raises :class:`ChainError` with the reason in words. web3 is the optional ``chain`` extra, imported
only where settlement is used.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError, MethodUnavailable, TimeExhausted, Web3Exception

CONTRACTS = ("RewardToken", "StakeRegistry", "CreditDistributor")


class ChainError(Exception):
    """A transaction or read failed; the message says why in words."""


def artifact(name: str) -> dict[str, Any]:
    if name not in CONTRACTS:
        raise ValueError(f"unknown contract {name!r}")
    artifact: dict[str, Any] = json.loads(
        resources.files("intellect_protocol.contracts").joinpath("artifacts", f"{name}.json").read_text()
    )
    return artifact


def connect(rpc_url: str, timeout_s: float = 10.0) -> Web3:
    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": timeout_s}))
    if not w3.is_connected():
        raise ChainError(f"no EVM node answers at {rpc_url}")
    return w3


def contract(w3: Web3, name: str, address: str) -> Contract:
    return w3.eth.contract(address=Web3.to_checksum_address(address), abi=artifact(name)["abi"])


def send(
    w3: Web3,
    sender: LocalAccount,
    build: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    confirmations: int = 1,
    timeout_s: float = 120.0,
) -> Any:
    """Sign and send the transaction ``build(params)`` makes; return its receipt once ``confirmations`` blocks hold it."""
    params: dict[str, Any] = {
        "from": sender.address,
        "nonce": w3.eth.get_transaction_count(sender.address, "pending"),
        "chainId": w3.eth.chain_id,
    }
    balance = w3.eth.get_balance(sender.address)
    if balance == 0:  # RPC nodes refuse even to estimate the gas of a sender that cannot pay any fee
        raise ChainError(f"insufficient gas: {sender.address} holds no ETH to pay the transaction fee")
    try:
        tx = build(params)
    except Exception as e:
        reason = revert_reason(e)
        if reason is None:
            raise
        raise ChainError(reason) from e
    fee = tx["gas"] * tx.get("maxFeePerGas", tx.get("gasPrice", 0))
    if balance < fee:
        raise ChainError(
            f"insufficient gas: {sender.address} holds {Web3.from_wei(balance, 'ether')} ETH, the transaction may cost up to {Web3.from_wei(fee, 'ether')}"
        )
    try:
        tx_hash = w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=timeout_s, poll_latency=0.2)
    except TimeExhausted as e:
        raise ChainError(f"transaction not mined within {timeout_s:.0f} s") from e
    except Web3Exception as e:
        raise ChainError(str(e)) from e
    if receipt["status"] != 1:
        raise ChainError(f"transaction {tx_hash.to_0x_hex()} reverted")
    deadline = time.monotonic() + timeout_s
    while w3.eth.block_number < receipt["blockNumber"] + confirmations - 1:
        if time.monotonic() > deadline:
            raise ChainError(
                f"transaction {tx_hash.to_0x_hex()} mined but not {confirmations} blocks deep within {timeout_s:.0f} s"
            )
        time.sleep(0.5)
    return receipt


def revert_reason(error: Exception) -> str | None:
    """The contract's reason if ``error`` is a revert, else None. RPC nodes raise ContractLogicError;
    the in-process tester raises its own type, with the same message."""
    message = (error.message or "") if isinstance(error, ContractLogicError) else str(error)
    if not isinstance(error, ContractLogicError) and not message.startswith("execution reverted"):
        return None
    return message.removeprefix("execution reverted").lstrip(": ").strip() or "the contract refused the transaction"


def deploy(w3: Web3, sender: LocalAccount, name: str, *args: Any, confirmations: int = 1) -> str:
    spec = artifact(name)
    factory = w3.eth.contract(abi=spec["abi"], bytecode=spec["bytecode"])
    receipt = send(w3, sender, lambda p: factory.constructor(*args).build_transaction(p), confirmations=confirmations)
    return str(receipt["contractAddress"])


@dataclass(frozen=True)
class PostedRoot:
    """One root as the chain holds it: what it counts (credit final at ``cutoff``) and when it came."""

    root: bytes
    cutoff: int
    tx_hash: str
    block_time: int


@dataclass
class Settlement:
    """The three contracts of one deployment."""

    w3: Web3
    token: Contract
    registry: Contract
    distributor: Contract

    @classmethod
    def at(cls, w3: Web3, token: str, registry: str, distributor: str) -> Settlement:
        return cls(
            w3,
            contract(w3, "RewardToken", token),
            contract(w3, "StakeRegistry", registry),
            contract(w3, "CreditDistributor", distributor),
        )

    @classmethod
    def deploy(cls, w3: Web3, admin: LocalAccount, *, unbonding_s: int, reward_supply: int) -> Settlement:
        """Deploy token, distributor and registry (slashed stake funds the distributor), make
        ``admin`` poster and slasher, and fund the distributor with ``reward_supply``."""
        token = deploy(w3, admin, "RewardToken", "Intellect Test Credit", "ICRED")
        distributor = deploy(w3, admin, "CreditDistributor", token)
        registry = deploy(w3, admin, "StakeRegistry", token, unbonding_s, distributor)
        s = cls.at(w3, token, registry, distributor)
        s.transact(admin, s.distributor.functions.grantRole(s.distributor.functions.POSTER_ROLE().call(), admin.address))
        s.transact(admin, s.registry.functions.grantRole(s.registry.functions.SLASHER_ROLE().call(), admin.address))
        s.transact(admin, s.token.functions.mint(distributor, reward_supply))
        return s

    def transact(self, sender: LocalAccount, fn: Any, confirmations: int = 1) -> Any:
        """Send the contract call ``fn`` (its gas is estimated first, so a revert surfaces before anything is sent).

        Estimated on the pending block, the one the call will be mined in: checks against the block's
        time (a root's cutoff) must see now, not the last block's time, which on a quiet chain is old."""

        def build(params: dict[str, Any]) -> dict[str, Any]:
            try:
                gas = fn.estimate_gas({"from": params["from"]}, block_identifier="pending")
            except MethodUnavailable:  # the in-process tester has one block, always current: no pending to ask
                gas = fn.estimate_gas({"from": params["from"]})
            built: dict[str, Any] = fn.build_transaction({**params, "gas": gas})
            return built

        return send(self.w3, sender, build, confirmations=confirmations)

    def stake_of(self, address: str) -> int:
        return int(self.registry.functions.staked(Web3.to_checksum_address(address)).call())

    def root_at(self, epoch: int) -> bytes:
        return bytes(self.distributor.functions.roots(epoch).call())

    def posted_roots(self, from_block: int, to_block: int | None = None) -> dict[int, PostedRoot]:
        """Every root the distributor accepted (its ``RootPosted`` events) up to ``to_block`` (the latest: None), by epoch."""
        out = {}
        logs = self.distributor.events.RootPosted.get_logs(
            from_block=from_block, to_block="latest" if to_block is None else to_block
        )
        for event in logs:
            block = self.w3.eth.get_block(event["blockNumber"])
            out[int(event["args"]["epoch"])] = PostedRoot(
                bytes(event["args"]["root"]),
                int(event["args"]["cutoff"]),
                event["transactionHash"].to_0x_hex(),
                int(block["timestamp"]),
            )
        return out

    def latest_epoch(self, block: int | None = None) -> int:
        """The newest epoch posted, as of ``block`` (the latest: None)."""
        return int(self.distributor.functions.latest_epoch().call(block_identifier="latest" if block is None else block))

    def claimed(self, address: str) -> int:
        return int(self.distributor.functions.claimed(Web3.to_checksum_address(address)).call())
