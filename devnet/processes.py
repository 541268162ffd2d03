"""Start the network's processes on loopback and wait until they answer.

Used by ``intellect-devnet``, the tests and the benchmarks alike, so all three exercise
the same console scripts a real operator runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from intellect_protocol.devnet.certificates import ServerFiles
from intellect_protocol.devnet.warm import WarmPopen, is_warm
from intellect_protocol.shared.tls import client_context


class StartError(RuntimeError):
    """A process did not come up; the message names it and carries its log's tail."""


def free_port() -> int:
    """A port no socket holds now (another server may take it before it is bound: :class:`PortTaken`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def script(name: str) -> list[str]:
    """The installed console script ``name``; these tools launch what operators run, nothing else."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise StartError(f"{name} is not installed; run: pip install -e .")
    return [found]


WINDING_DOWN_S = 20.0
"""How much longer than its stop deadline a role still writing its log is given before it is killed."""


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes] | WarmPopen
    log_path: Path
    url: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """The environment it was started with beyond ours (to restart it the same way)."""
    ca: Path | None = None
    """The CA that signed its certificate, when it serves HTTPS."""

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, timeout: float = 10, winding_down_s: float = WINDING_DOWN_S) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``, or later while it still writes its log (a trainer finishing its
        checkpoint), up to ``winding_down_s`` more; returns the exit code (0 for a clean stop on our SIGTERM, even by
        a server that re-raises the signal once it has shut down)."""
        if self.popen.poll() is None:
            self.popen.terminate()
            deadline, cap = time.monotonic() + timeout, time.monotonic() + timeout + winding_down_s
            while True:
                try:
                    self.popen.wait(max(0.0, deadline - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= cap or not self._writing():
                        self.popen.kill()
                        self.popen.wait()
                        return self.popen.returncode
                    deadline = min(cap, time.monotonic() + 1.0)
        return 0 if self.popen.returncode == -signal.SIGTERM else self.popen.returncode

    def _writing(self, within_s: float = 2.0) -> bool:
        """Whether its log grew in the last ``within_s`` seconds."""
        try:
            return time.time() - self.log_path.stat().st_mtime < within_s
        except OSError:
            return False

    def kill(self) -> None:
        self.popen.kill()
        self.popen.wait()

    def restart(self) -> None:
        """Start the same command again (same port, same log); returns once a server answers again."""
        again = spawn(self.name, list(self.popen.args), self.log_path, self.env)  # type: ignore[arg-type]
        self.popen = again.popen
        if self.url is not None:
            wait_http(self, f"{self.url}/healthz", ca=self.ca)


def spawn(name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> Process:
    """Start ``args`` in a session of its own (Ctrl-C at the terminal reaches only the launcher, which stops every
    role once, in order), its output appended to ``log_path``; a role that loads a model forks warm."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if is_warm(args, full_env):
        return Process(name, WarmPopen(args, log_path, full_env), log_path, env=dict(env or {}))
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, start_new_session=True
        )
    return Process(name, popen, log_path, env=dict(env or {}))


def wait_http(process: Process, url: str, timeout: float = 60, ca: Path | None = None) -> None:
    """Wait until ``url`` answers 2xx (over HTTPS trusting ``ca``, if given); raise :class:`StartError`
    if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    # One client: each new one costs ~25 ms of CPU, ten times a second.
    with httpx.Client(timeout=2, verify=client_context(ca)) as http:
        while time.monotonic() < deadline:
            if process.popen.poll() is not None:
                raise StartError(f"{process.name} exited with code {process.popen.returncode}:\n{process.tail()}")
            try:
                reply = http.get(url)
            except httpx.HTTPError:
                pass
            else:
                if reply.is_success:
                    if (pid := _pid(reply)) not in (None, process.popen.pid):
                        raise PortTaken(f"another process (pid {pid}) answers {url}: {process.name} lost its port to it")
                    return
            time.sleep(0.1)
    raise StartError(f"{process.name} did not answer {url} within {timeout:.0f} s:\n{process.tail()}")


class PortTaken(StartError):
    """Another server took the port chosen for a process before it could (ports are picked free, then bound later)."""


def _pid(reply: httpx.Response) -> int | None:
    """The process id a server's /healthz names (None: it names none)."""
    try:
        pid = reply.json().get("pid")
    except (ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) else None


def on_a_free_port(start: Callable[[int], Process], port: int | None) -> Process:
    """``start(port)``, on a free port unless ``port`` is given: chosen again if another server takes it first."""
    for attempt in range(3):
        try:
            return start(port or free_port())
        except PortTaken:
            if port is not None or attempt == 2:
                raise
    raise AssertionError("unreachable")


def answering(process: Process, port: int, tls: ServerFiles | None = None) -> Process:
    """``process`` once it answers /healthz on ``port`` (over HTTPS with ``tls``); stopped if it never
    does (StartError) or the wait is interrupted (a Ctrl-C during start must not leave it running)."""
    process.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    process.ca = tls.ca if tls else None
    try:
        wait_http(process, f"{process.url}/healthz", ca=process.ca)
    except BaseException:
        process.stop()
        raise
    return process


def coordinator_command(args: list[str], log_path: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run one ``intellect-coordinator`` command to completion (``env`` added to this process' environment); its
    stdout, or StartError with its output."""
    result = subprocess.run(
        [*script("intellect-coordinator"), *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise StartError(f"intellect-coordinator {args[0]} failed:\n{result.stdout}{result.stderr}")
    return result.stdout.strip()


def calibrate(model: Path, numerics: str, rows: int, max_tokens: int, out: Path, log_path: Path) -> None:
    """``intellect-validator calibrate`` of ``model`` in ``numerics`` (``engine/dtype``), its tolerances written to ``out``."""
    engine, _, dtype = numerics.partition("/")
    args = ["calibrate", "--model", str(model), "--engine", engine, "--dtype", dtype, "--rows", str(rows)]
    args += ["--max-tokens", str(max_tokens), "--out", str(out)]
    log_path.unlink(missing_ok=True)
    process = spawn("calibrate", [*script("intellect-validator"), *args], log_path)
    try:
        code = process.popen.wait()
    finally:  # Ctrl-C reaches only the launcher (the calibration has a session of its own): it stops it
        process.stop()
    if code != 0:
        raise StartError(f"intellect-validator calibrate failed (log: {log_path}):\n{process.tail(40)}")


def migrate(database_url: str, log_path: Path) -> None:
    coordinator_command(["migrate", "--database-url", database_url], log_path)


def admin_token(database_url: str, name: str = "devnet", scope: str = "admin") -> str:
    args = ["admin-token", "create", "--name", name, "--scope", scope, "--database-url", database_url]
    return coordinator_command(args).splitlines()[-1]


def create_run(database_url: str, name: str, log_path: Path, options: list[str] = (), blob_dir: Path | None = None) -> str:  # type: ignore[assignment]
    """A run with ``run create``'s defaults (arithmetic on the shipped tiny model) but for ``options``; returns its id.
    ``blob_dir``: the coordinator's blob store, where a pretraining run's shards are put."""
    env = {"INTELLECT_BLOB_DIR": str(blob_dir)} if blob_dir else None
    return coordinator_command(["run", "create", "--name", name, "--database-url", database_url, *options], log_path, env)


def start_coordinator(
    workdir: Path,
    database_url: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    tls: ServerFiles | None = None,
) -> Process:
    """Serve a coordinator on an already migrated database (over HTTPS with ``tls``); returns once it answers /healthz."""
    return on_a_free_port(lambda chosen: _serve_coordinator(workdir, database_url, chosen, env, tls), port)


def _serve_coordinator(
    workdir: Path, database_url: str, port: int, env: dict[str, str] | None, tls: ServerFiles | None
) -> Process:
    process = spawn(
        "coordinator",
        [
            *script("intellect-coordinator"),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--database-url",
            database_url,
            "--log-level",
            "info",
            *(tls.args if tls else []),
        ],
        workdir / "logs" / "coordinator.log",
        {"INTELLECT_BLOB_DIR": str(workdir / "blobs"), **(env or {})},  # run output stays in the run's workdir
    )
    return answering(process, port, tls)


def start_node(
    workdir: Path, name: str, wallet: Path, coordinator_url: str, password: str, env: dict[str, str] | None = None
) -> Process:
    return spawn(
        name,
        [
            *script("intellect-node"),
            "join",
            "--wallet",
            str(wallet),
            "--coordinator",
            coordinator_url,
            "--state-dir",
            str(workdir / "state" / name),
        ],
        workdir / "logs" / f"{name}.log",
        {"INTELLECT_WALLET_PASSWORD": password, **(env or {})},
    )


def start_relay(
    workdir: Path,
    name: str,
    wallet: Path,
    password: str,
    coordinator_url: str,
    *,
    upstreams: list[str] = (),  # type: ignore[assignment]
    origin: bool = False,
    port: int | None = None,
    extra: list[str] = (),  # type: ignore[assignment]
    tls: ServerFiles | None = None,
) -> Process:
    """An ``intellect-relay`` (or, with ``origin``, the trainer's origin) serving from
    ``workdir/NAME`` (over HTTPS with ``tls``, trusting its CA for upstreams and the coordinator);
    returns once it answers /healthz."""

    def serve(chosen: int) -> Process:
        args = [*script("intellect-relay"), "--coordinator", coordinator_url, "--wallet", str(wallet)]
        args += ["--data-dir", str(workdir / name), "--port", str(chosen), *extra]
        args += ["--origin"] if origin else [arg for upstream in upstreams for arg in ("--upstream", upstream)]
        args += [*tls.args, "--ca-file", str(tls.ca)] if tls else []
        process = spawn(name, args, workdir / "logs" / f"{name}.log", {"INTELLECT_WALLET_PASSWORD": password})
        return answering(process, chosen, tls)

    return on_a_free_port(serve, port)
