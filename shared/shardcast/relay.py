"""A relay's (or an origin's) background work beside its server.

- Registers with the coordinator (signed; the key must hold the relay role) and refreshes
  that registration, so it stays in the list clients download from.
- Follows the coordinator's manifest log by long-poll: a new step is known within moments.
- Relay: for the newest ``keep`` steps of each run, fetches every missing chunk from its
  upstreams (the origin or other relays), several at once, verifies each against the
  manifest and only then marks it held (which is when the server starts passing it on).
- Origin: the trainer wrote the files and the manifest in place; it only rescans its directory.
- Both apply the store's retention.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from eth_account.signers.local import LocalAccount

from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
from intellect_protocol.shared.relay_schemas import RelayRegister
from intellect_protocol.shared.shardcast.manifest import ManifestEntry, ManifestError
from intellect_protocol.shared.shardcast.store import Step, StepStore
from intellect_protocol.shared.shardcast.transfer import fetch_range

log = logging.getLogger("intellect.relay")

LONG_POLL_S = 2.0
"""Short enough that a stopping relay is not held up by a poll in flight (it runs on a thread)."""
REFRESH_S = 20.0
PRUNE_S = 2.0


class RelayWorker:
    def __init__(
        self,
        store: StepStore,
        coordinator: str,
        account: LocalAccount,
        public_url: str,
        *,
        upstreams: Sequence[str] = (),
        concurrency: int = 4,
    ) -> None:
        self.store = store
        self.account = account
        self.public_url = public_url
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.kind = "origin" if store.complete_on_disk else "relay"
        self.concurrency = concurrency
        self.after = 0
        self.stop = threading.Event()
        """Set when the worker ends: its requests waiting on the coordinator give up."""
        self.api = CoordinatorClient(coordinator, account, timeout=LONG_POLL_S + 10, stop=self.stop)
        self._fetching: dict[tuple[str, int], asyncio.Task[None]] = {}
        if self.kind == "relay" and not self.upstreams:
            raise ValueError("a relay needs at least one upstream (the origin or another relay)")

    async def run(self) -> None:
        try:
            await self._register()
            await asyncio.gather(self._refresh(), self._follow(), self._prune())
        finally:
            self.stop.set()
            self.api.close()

    async def _register(self) -> None:
        body = RelayRegister(address=self.account.address, url=self.public_url, kind=self.kind)
        await asyncio.to_thread(self.api.register_relay, body)

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self._register()
            except Refused as e:
                log.warning("registration refresh refused: %s", e)

    async def _prune(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_S)
            if self.store.complete_on_disk:
                self.store.scan()
            for key in self.store.prune():
                log.info("deleted step %s of %s (retention)", key[1], key[0])

    async def _follow(self) -> None:
        while True:
            entries = await asyncio.to_thread(self.api.manifests, self.after, LONG_POLL_S)
            if not entries:
                continue
            self.after = entries[-1].id
            trainers = await asyncio.to_thread(self.api.role_holders, "trainer")
            for entry in entries:
                self._take(entry, trainers)

    def _take(self, entry: ManifestEntry, trainers: set[str]) -> None:
        signed = entry.signed
        try:
            signed.verify(trainers)
        except (ValueError, ManifestError) as e:
            log.warning("ignoring manifest %s: %s", entry.id, e)
            return
        if self.kind == "origin":
            self.store.scan()
            return
        step = self.store.add(signed)
        self.store.prune()
        key = (signed.manifest.run_id, signed.manifest.step)
        if step.retired_at is None and not step.complete and key not in self._fetching:
            self._fetching[key] = asyncio.create_task(self._fetch(step))

    async def _fetch(self, step: Step) -> None:
        """Every missing chunk of ``step``, in order, ``concurrency`` at a time."""
        slots = asyncio.Semaphore(self.concurrency)

        async def one(index: int) -> None:
            async with slots:
                await self._fetch_chunk(step, index)

        missing = [i for i in range(len(step.manifest.chunks)) if i not in step.held]
        await asyncio.gather(*(one(i) for i in missing))
        self._fetching.pop((step.manifest.run_id, step.manifest.step), None)
        if step.complete:
            log.info("step %s of %s complete", step.manifest.step, step.manifest.run_id)

    async def _fetch_chunk(self, step: Step, index: int) -> None:
        chunk = step.manifest.chunks[index]
        entry = step.manifest.files[chunk.file]
        attempt = 0
        while step.retired_at is None:
            source = self.upstreams[(index + attempt) % len(self.upstreams)]
            attempt += 1
            url = f"{source}/v1/runs/{step.manifest.run_id}/steps/{step.manifest.step}/files/{entry.path}"
            try:
                if await asyncio.to_thread(_fetch_into, url, step.dir / entry.path, chunk.offset, chunk.length, chunk.blake3):
                    step.mark_held(index)
                    return
                log.warning("chunk %d of step %d from %s did not match its hash", index, step.manifest.step, source)
            except OSError as e:
                log.info("chunk %d of step %d from %s failed: %s", index, step.manifest.step, source, e)
            if attempt % len(self.upstreams) == 0:
                await asyncio.sleep(min(0.2 * attempt, 5.0))


def _fetch_into(url: str, path: Path, offset: int, length: int, expected: str) -> bool:
    fd = os.open(path, os.O_WRONLY)
    try:
        return fetch_range(url, fd, offset, length, expected)
    finally:
        os.close(fd)
