"""A lean HTTP/1.1 keep-alive load generator for benchmarks.

httpx costs more CPU per request than the server it would measure; on a 2-core machine the
load generator must stay light, so this writes pre-built requests and parses only the status
line and Content-Length.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence


def build_request(method: str, path: str, host: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    if body:
        lines.append("content-type: application/json")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> int:
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


async def closed_loop(
    host: str, port: int, requests: Sequence[bytes], connections: int
) -> tuple[float, list[float], dict[int, int]]:
    """Send every request as fast as ``connections`` keep-alive connections allow.

    Returns elapsed seconds, latencies and a count per status code.
    """
    queue = iter(requests)
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        for raw in queue:
            start = time.perf_counter()
            status = await _send(reader, writer, raw)
            latencies.append(time.perf_counter() - start)
            statuses[status] = statuses.get(status, 0) + 1
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return time.perf_counter() - start, latencies, statuses


async def open_loop(
    host: str, port: int | Sequence[int], requests: Sequence[bytes], rate_per_s: float, connections: int
) -> tuple[float, list[float], dict[int, int]]:
    """Send request i at ``i / rate_per_s`` whether or not earlier ones came back (several
    ``port``\s: the connections are spread over them, a simple round-robin balancer).

    Latency counts from the scheduled send time, so a server that falls behind is charged
    for the queue it builds (no coordinated omission).
    """
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    ports = [port] if isinstance(port, int) else list(port)
    for i in range(connections):
        pool.put_nowait(await asyncio.open_connection(host, ports[i % len(ports)]))
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def one(raw: bytes, scheduled: float) -> None:
        conn = await pool.get()
        try:
            status = await _send(*conn, raw)
        finally:
            pool.put_nowait(conn)
        latencies.append(time.perf_counter() - scheduled)
        statuses[status] = statuses.get(status, 0) + 1

    start = time.perf_counter()
    tasks = []
    for i, raw in enumerate(requests):
        scheduled = start + i / rate_per_s
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(raw, scheduled)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    while not pool.empty():
        pool.get_nowait()[1].close()
    return elapsed, latencies, statuses
