"""Download a policy step: the manifest from the coordinator, the bytes from relays.

:func:`download_step` fetches the signed manifest from the coordinator and checks that a
current trainer signed it, preallocates the files, then fetches chunks with HTTP Range from
several relays at once, writing each at its offset and verifying its blake3 as it arrives.
A chunk that fails or does not match is fetched again elsewhere; a relay that served bad
bytes is dropped for this download and reported to the coordinator. Relays are chosen by
measured throughput with some exploration; the origin is the fallback. Verified chunks are
logged in ``.shardcast-progress`` in the destination, so a restarted download fetches only
what is missing. The finished directory holds the step's files and its ``manifest.json``.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from intellect_protocol.shared.coordinator_client import CoordinatorClient, ProtocolError
from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.files import write_atomic
from intellect_protocol.shared.relay_schemas import RelayReportRequest
from intellect_protocol.shared.shardcast.manifest import Manifest, SignedManifest
from intellect_protocol.shared.shardcast.store import MANIFEST_FILE, preallocate
from intellect_protocol.shared.shardcast.transfer import TransferError, fetch_range

log = logging.getLogger(__name__)
PROGRESS_FILE = ".shardcast-progress"
MAX_ATTEMPTS = 12


class DownloadError(RuntimeError):
    """The step could not be downloaded (no manifest, untrusted signer, or no source had a chunk)."""


@dataclass(eq=False)
class Source:
    url: str
    kind: str
    throughput: float | None = None
    """Bytes/s, an exponential moving average over this source's chunks."""
    failures: int = 0
    dropped: bool = False


class SourcePicker:
    """Relays by measured throughput, each untried one first, a random one ``explore`` of the
    time; the origin only when no relay is left for a chunk."""

    def __init__(self, sources: list[Source], explore: float = 0.1, rng: random.Random | None = None) -> None:
        self.sources = sources
        self.explore = explore
        self.rng = rng or random.Random()
        self.busy: dict[Source, int] = dict.fromkeys(sources, 0)
        self.lock = threading.Lock()

    def take(self, avoid: set[Source]) -> Source | None:
        """:meth:`pick` a source and count one more transfer on it (:meth:`release` when done)."""
        with self.lock:
            source = self.pick(avoid)
            if source is not None:
                self.busy[source] += 1
            return source

    def release(self, source: Source, size: int = 0, seconds: float = 0.0, *, failed: bool = False, bad: bool = False) -> None:
        with self.lock:
            self.busy[source] -= 1
            if bad:
                source.dropped = True
            elif failed:
                self.fail(source)
            elif size:
                self.record(source, size, seconds)

    def pick(self, avoid: set[Source]) -> Source | None:
        usable = [s for s in self.sources if not s.dropped and s not in avoid]
        relays = [s for s in usable if s.kind == "relay"] or usable
        if not relays:
            return None
        untried = [s for s in relays if s.throughput is None]
        if untried:
            return min(untried, key=lambda s: self.busy[s])
        if self.rng.random() < self.explore:
            return self.rng.choice(relays)
        # Expected time for the next chunk: share of throughput left for one more transfer.
        return max(relays, key=lambda s: (s.throughput or 0.0) / (1 + self.busy[s]))

    def record(self, source: Source, size: int, seconds: float) -> None:
        rate = size / max(seconds, 1e-6)
        source.throughput = rate if source.throughput is None else 0.7 * source.throughput + 0.3 * rate

    def fail(self, source: Source) -> None:
        source.failures += 1
        if source.failures >= 3:
            source.dropped = True


@spent("weights download")
def download_step(
    api: CoordinatorClient,
    run_id: str,
    step: int,
    dest: Path,
    *,
    concurrency: int = 8,
    on_progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Download ``step`` of ``run_id`` into ``dest`` (resuming what is there); returns its manifest.

    Bad relays are reported when ``api`` has an account to sign with; ``on_progress(done_bytes,
    total_bytes)`` is called (from worker threads) as chunks are verified.
    """
    entry = api.manifest(run_id, step)
    if entry is None:
        raise DownloadError(f"the coordinator has no manifest for step {step} of {run_id}")
    try:
        manifest = entry.signed.verify(api.role_holders("trainer"))
    except ValueError as e:
        raise DownloadError(str(e)) from None
    if (manifest.run_id, manifest.step) != (run_id, step):
        raise DownloadError(f"the coordinator answered with step {manifest.step} of {manifest.run_id}")
    sources = [Source(r.url.rstrip("/"), r.kind) for r in api.relays()]
    # A report is a courtesy to the network: sent once, never waited for.
    reporter = None if api.account is None else CoordinatorClient(api.base_url, api.account, timeout=10.0, give_up_s=0)
    try:
        _fetch_all(entry.signed, dest, sources, reporter, concurrency, on_progress)
    finally:
        if reporter is not None:
            reporter.close()
    return manifest


def _prepare(signed: SignedManifest, dest: Path) -> set[int]:
    """Preallocate the files; the chunks verified by an earlier attempt at this same manifest."""
    manifest = signed.manifest
    preallocate(manifest, dest)
    progress = dest / PROGRESS_FILE
    lines = progress.read_text().split() if progress.exists() else []
    if not lines or lines[0] != manifest.digest():
        progress.write_text(manifest.digest() + "\n")
        return set()
    return {int(x) for x in lines[1:] if x.isascii() and x.isdigit() and int(x) < len(manifest.chunks)}


def _fetch_all(
    signed: SignedManifest,
    dest: Path,
    sources: list[Source],
    reporter: CoordinatorClient | None,
    concurrency: int,
    on_progress: Callable[[int, int], None] | None,
) -> None:
    manifest = signed.manifest
    held = _prepare(signed, dest)
    missing = [i for i in range(len(manifest.chunks)) if i not in held]
    state = {"done": sum(manifest.chunks[i].length for i in held)}
    if on_progress:
        on_progress(state["done"], manifest.total_bytes)
    if missing and not sources:
        raise DownloadError("the coordinator lists no relay or origin to download from")
    picker = SourcePicker(sources)
    lock = threading.Lock()
    fds = {i: os.open(dest / entry.path, os.O_WRONLY) for i, entry in enumerate(manifest.files)}
    progress = (dest / PROGRESS_FILE).open("a")
    failed = threading.Event()  # one chunk that no source could serve ends the download

    def report(source: Source, index: int, reason: str) -> None:
        if reporter is None:
            return
        body = RelayReportRequest(relay_url=source.url, run_id=manifest.run_id, step=manifest.step, chunk=index, reason=reason)
        try:
            reporter.report_relay(body)
        except ProtocolError as e:
            log.info("the report on %s was not taken: %s", source.url, e)

    def one(index: int) -> None:
        if failed.is_set():
            return
        chunk = manifest.chunks[index]
        url_path = f"/v1/runs/{manifest.run_id}/steps/{manifest.step}/files/{manifest.files[chunk.file].path}"
        avoid: set[Source] = set()
        for _ in range(MAX_ATTEMPTS):
            source = picker.take(avoid)
            if source is None:
                avoid.clear()  # every source failed this chunk once: wait, then try them again
                time.sleep(0.5)
                continue
            started = time.perf_counter()
            try:
                ok = fetch_range(source.url + url_path, fds[chunk.file], chunk.offset, chunk.length, chunk.blake3)
            except TransferError:
                picker.release(source, failed=True)
                avoid.add(source)
                if source.dropped:
                    report(source, index, "unavailable")
                continue
            if not ok:
                picker.release(source, bad=True)
                report(source, index, "hash_mismatch")
                continue
            picker.release(source, chunk.length, time.perf_counter() - started)
            with lock:
                progress.write(f"{index}\n")
                progress.flush()
                state["done"] += chunk.length
                if on_progress:
                    on_progress(state["done"], manifest.total_bytes)
            return
        failed.set()
        raise DownloadError(f"no source served a verified chunk {index} of step {manifest.step}")

    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="shardcast") as pool:
            for result in [pool.submit(one, i) for i in missing]:
                result.result()
    finally:
        progress.close()
        for fd in fds.values():
            os.close(fd)
    write_atomic(dest / MANIFEST_FILE, signed.model_dump_json().encode())
    (dest / PROGRESS_FILE).unlink()
