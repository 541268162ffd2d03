"""The settlement loop: close an epoch every ``epoch_s``, post each unanchored root, record it once
confirmed; slash the stake of nodes banned for forgery once their dispute window is over.

Idempotent across restarts and replicas: before posting, the chain is asked whether the epoch's
root is there already (posted by a replica, or by this process before a crash) and, if so, the
transaction is read back from the contract's event instead of sent again. The contract refuses a
second root for an epoch, so a race between replicas costs one failed transaction, never a
wrong root. When the chain is down the ledger goes on; epochs pile up and are posted in order
once it answers (``/healthz`` shows how many are waiting, and why).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from typing import Any

from eth_account.signers.local import LocalAccount
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from intellect_protocol.coordinator.services import settlement as epochs
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.settlement_models import Epoch
from intellect_protocol.shared.wallet import load_wallet

log = logging.getLogger(__name__)

CHAIN_PASSWORD_ENV = "INTELLECT_CHAIN_PASSWORD"


class Anchorer:
    def __init__(self, sessions: sessionmaker[Session], settings: CoordinatorSettings) -> None:
        self.sessions = sessions
        self.settings = settings
        self.chain_settings = settings.chain.deployed()
        self.sender: LocalAccount = load_wallet(self.chain_settings.keystore, os.environ.get(CHAIN_PASSWORD_ENV, ""))
        self.chain_error: str | None = None
        self.chain_id: int | None = None
        self._settlement: Any = None
        self._next_close = 0.0

    def tick(self) -> None:
        if time.monotonic() >= self._next_close:
            self._close_epoch()
        with self.sessions() as session:
            waiting = epochs.unanchored(session)
        try:
            for epoch in waiting:
                self._anchor(epoch)
            self._slash()
            self.chain_error = None
        except Exception as e:  # the chain being down (or refusing) never stops the ledger: retried next tick
            self.chain_error = f"{type(e).__name__}: {e}"
            self._settlement = None
            log.warning("anchoring waits: %s", self.chain_error)

    def status(self) -> dict[str, object]:
        with self.sessions() as session:
            waiting = len(epochs.unanchored(session))
        return {"chain": self.chain_error or "ok", "sender": self.sender.address, "unanchored_epochs": waiting}

    def _close_epoch(self) -> None:
        now = datetime.now(UTC)
        with self.sessions() as session:
            last = epochs.latest_epoch(session)
        if last is not None and (now - last.created_at).total_seconds() < self.settings.chain.epoch_s:
            self._next_close = time.monotonic() + self.settings.chain.epoch_s - (now - last.created_at).total_seconds()
            return
        try:
            with self.sessions.begin() as session:
                closed = epochs.close_epoch(session, now, self.settings.chain.cutoff_lag_s)
            if closed is not None:
                log.info("epoch %d closed: %d addresses, root %s", closed.epoch, closed.addresses, closed.root)
        except IntegrityError:
            pass  # a replica closed this epoch first
        self._next_close = time.monotonic() + self.settings.chain.epoch_s

    def chain(self) -> Any:
        """The deployment's contracts, connected on first use (and again after a failure)."""
        if self._settlement is None:
            from intellect_protocol.shared.chain import Settlement, connect

            s = self.chain_settings
            self._settlement = Settlement.at(connect(s.rpc_url), s.token, s.stake_registry, s.distributor)
            self.chain_id = self._settlement.w3.eth.chain_id
        return self._settlement

    def _slash(self) -> None:
        """Slash each ban that is due; like a root, a slash already on chain (sent before a crash) is
        read back from its event, never sent twice."""
        with self.sessions() as session:
            due = epochs.slashes_due(session, datetime.now(UTC), self.settings.dispute_window_s)
        for ban in due:
            chain = self.chain()
            registry = chain.registry
            logged = registry.events.Slashed.get_logs(
                from_block=self.settings.chain.from_block, argument_filters={"account": ban.address}
            )
            sent = [e for e in logged if bytes(e["args"]["evidence"]) == ban.evidence]
            if sent:
                amount, tx_hash = sent[0]["args"]["amount"], sent[0]["transactionHash"].to_0x_hex()
            elif registry.functions.staked(ban.address).call() + registry.functions.unbonding(ban.address).call() == 0:
                amount, tx_hash = 0, None
            else:
                receipt = chain.transact(
                    self.sender,
                    registry.functions.slash(ban.address, 2**256 - 1, ban.evidence),
                    self.settings.chain.confirmations,
                )
                from web3.logs import DISCARD

                # The slash's receipt also holds the token's Transfer log: not a Slashed event, and no cause for
                # web3's MismatchedABI warning, which operators read as an error.
                slashed = registry.events.Slashed().process_receipt(receipt, errors=DISCARD)
                amount, tx_hash = (
                    slashed[0]["args"]["amount"],
                    receipt["transactionHash"].to_0x_hex(),
                )
            with self.sessions.begin() as session:
                epochs.record_slashing(session, ban, amount, tx_hash, datetime.now(UTC))
            log.warning("slashed %s: %d base units, citing %s (tx %s)", ban.address, amount, ", ".join(ban.submissions), tx_hash)

    def _anchor(self, epoch: Epoch) -> None:
        from intellect_protocol.shared.chain import ChainError

        chain = self.chain()
        root = bytes.fromhex(epoch.root.removeprefix("0x"))
        on_chain = chain.root_at(epoch.epoch)
        if on_chain == b"\0" * 32:
            if chain.latest_epoch() >= epoch.epoch:
                raise ChainError(
                    f"epoch {epoch.epoch} can no longer be posted: the chain is at epoch {chain.latest_epoch()} (another poster?)"
                )
            receipt = chain.transact(
                self.sender,
                chain.distributor.functions.post_root(epoch.epoch, root, int(epoch.cutoff.timestamp())),
                self.settings.chain.confirmations,
            )
            tx_hash, block = receipt["transactionHash"].to_0x_hex(), receipt["blockNumber"]
        elif on_chain == root:  # posted before a crash, or by a replica: read the transaction back
            event = chain.distributor.events.RootPosted.get_logs(
                from_block=self.settings.chain.from_block, argument_filters={"epoch": epoch.epoch}
            )[0]
            tx_hash, block = event["transactionHash"].to_0x_hex(), event["blockNumber"]
            if chain.w3.eth.block_number < block + self.settings.chain.confirmations - 1:
                return  # not deep enough yet: recorded on a later tick
        else:
            raise ChainError(
                f"epoch {epoch.epoch} holds another root on chain (0x{on_chain.hex()}), not this ledger's {epoch.root}"
            )
        with self.sessions.begin() as session:
            epochs.record_anchor(session, epoch.epoch, tx_hash, block, datetime.now(UTC))
        log.info("epoch %d anchored in %s (block %d)", epoch.epoch, tx_hash, block)
