"""``intellect-devnet --chain``: anvil, the contracts deployed on it, and every node and validator funded and staked.

The coordinator's sender deploys the contracts (so it holds the poster and slasher roles) and
its keystore goes to the coordinator through the usual ``INTELLECT_CHAIN_*`` settings. Each node
and validator gets gas money and test tokens, and stakes them before it first asks for work (runs
there ask a stake of nodes and validators alike).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eth_account import Account
from eth_account.signers.local import LocalAccount

from intellect_protocol.devnet.anvil import fund, start_anvil
from intellect_protocol.devnet.processes import Process, StartError
from intellect_protocol.shared.money import TOKEN
from intellect_protocol.shared.wallet import load_wallet

if TYPE_CHECKING:
    from intellect_protocol.shared.chain import Settlement

NODE_STAKE = 100 * TOKEN
"""What each devnet node stakes (the run asks for MIN_STAKE_TOKENS of it)."""
MIN_STAKE_TOKENS = 50
EPOCH_S = 5.0
DISPUTE_WINDOW_S = 10.0
"""Short enough that credit turns final, epochs anchor and a banned cheater is slashed within a devnet run."""


@dataclass
class DevChain:
    anvil: Process
    settlement: Settlement
    sender: LocalAccount
    keystore: Path
    password: str

    @property
    def coordinator_env(self) -> dict[str, str]:
        s = self.settlement
        return {
            "INTELLECT_CHAIN_RPC_URL": str(self.anvil.url),
            "INTELLECT_CHAIN_TOKEN": s.token.address,
            "INTELLECT_CHAIN_STAKE_REGISTRY": s.registry.address,
            "INTELLECT_CHAIN_DISTRIBUTOR": s.distributor.address,
            "INTELLECT_CHAIN_KEYSTORE": str(self.keystore),
            "INTELLECT_CHAIN_PASSWORD": self.password,
            "INTELLECT_EPOCH_S": str(EPOCH_S),
            "INTELLECT_CHAIN_CUTOFF_LAG_S": "1",
            "INTELLECT_DISPUTE_WINDOW_S": str(DISPUTE_WINDOW_S),
        }

    def stake(self, wallet: Path, password: str) -> None:
        """Gas money and NODE_STAKE test tokens for the wallet's address, all of it staked."""
        account = load_wallet(wallet, password)
        s = self.settlement
        fund(str(self.anvil.url), account.address, 10 * TOKEN)
        s.transact(self.sender, s.token.functions.mint(account.address, NODE_STAKE))
        s.transact(account, s.token.functions.approve(s.registry.address, NODE_STAKE))
        s.transact(account, s.registry.functions.stake(NODE_STAKE))


def start_chain(workdir: Path) -> DevChain:
    """anvil plus deployed contracts; StartError (saying how to install what is missing) otherwise."""
    try:
        from intellect_protocol.shared.chain import Settlement, connect
    except ImportError:
        raise StartError("--chain needs web3: pip install -e '.[chain]'") from None
    anvil = start_anvil(workdir / "logs" / "anvil.log")
    try:
        sender: LocalAccount = Account.create()
        fund(str(anvil.url), sender.address, 1000 * TOKEN)
        settlement = Settlement.deploy(connect(str(anvil.url)), sender, unbonding_s=3600, reward_supply=10**9 * TOKEN)
        password = secrets.token_urlsafe(16)
        keystore = workdir / "wallets" / "chain-sender.json"
        keystore.parent.mkdir(parents=True, exist_ok=True)
        keystore.write_text(json.dumps(Account.encrypt(sender.key, password)))
        (workdir / "chain.json").write_text(
            json.dumps(
                {
                    "rpc_url": anvil.url,
                    "token": settlement.token.address,
                    "stake_registry": settlement.registry.address,
                    "distributor": settlement.distributor.address,
                },
                indent=2,
            )
        )
    except BaseException:
        anvil.stop()
        raise
    return DevChain(anvil, settlement, sender, keystore, password)
