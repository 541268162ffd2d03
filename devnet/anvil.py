"""A local EVM chain for ``intellect-devnet --chain`` and the settlement tests: Foundry's anvil.

anvil comes from the npm registry (``npm install -g @foundry-rs/anvil@1.7.1``); without it the devnet
says how to install it rather than failing somewhere later.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx

from intellect_protocol.devnet.processes import Process, StartError, free_port, spawn

INSTALL_HINT = "anvil (Foundry's local EVM node) is not installed; install it with: npm install -g @foundry-rs/anvil@1.7.1"


def anvil_binary() -> str:
    found = shutil.which("anvil")
    if found is None:
        raise StartError(INSTALL_HINT)
    return found


def start_anvil(log_path: Path, block_time_s: float | None = None) -> Process:
    """anvil on a free loopback port (mining each transaction at once unless ``block_time_s``), answering RPC."""
    port = free_port()
    args = [anvil_binary(), "--host", "127.0.0.1", "--port", str(port), "--silent"]
    if block_time_s:
        args += ["--block-time", str(block_time_s)]
    process = spawn("anvil", args, log_path)
    process.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise StartError(f"anvil exited with code {process.popen.returncode}:\n{process.tail()}")
        try:
            if httpx.post(
                process.url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}, timeout=2
            ).is_success:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.stop()
    raise StartError(f"anvil did not answer on {process.url}:\n{process.tail()}")


def rpc(url: str, method: str, *params: object) -> object:
    """One of anvil's own methods (``anvil_setBalance``, ``evm_increaseTime``, ``evm_mine``)."""
    reply = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}, timeout=10).json()
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")
    return reply.get("result")


def fund(url: str, address: str, wei: int) -> None:
    rpc(url, "anvil_setBalance", address, hex(wei))
