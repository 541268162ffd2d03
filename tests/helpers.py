"""Building blocks for tests that speak the node protocol by hand."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.services.runs import create_run
from intellect_protocol.shared.environments.registry import Environment, get_environment, plugin
from intellect_protocol.shared.island_schemas import OuterSettings
from intellect_protocol.shared.run_schemas import AuditPolicy, RunSpec
from intellect_protocol.shared.schemas import DEFAULT_MODEL, CheckOutcome, SamplingParams
from intellect_protocol.shared.signing import sign_request
from intellect_protocol.shared.verdicts import sign_verdict
from intellect_protocol.shared.version import __version__
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N

HTTP = httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))
"""What tests send plain HTTP with, in place of ``httpx.get`` and its kin: each of those builds a client, and with
it a TLS context (19 ms of CPU a request here, against 0.8 ms through this client). As they do, it keeps no connection open
between requests (tests count an address's connections) and sets no bound on how many are open at once (floods
from threads); no response a test reads sets a cookie."""


def keystore_json(key: bytes, password: str) -> str:
    """A throwaway wallet's keystore file (:data:`THROWAWAY_SCRYPT_N`): each role that loads eth-account's default
    pays 0.75 s of scrypt (46 s of what py-spy sampled in the integration stage's workers)."""
    return json.dumps(Account.encrypt(key, password, kdf="scrypt", iterations=THROWAWAY_SCRYPT_N))


SPECS = {"cpu_cores": 2, "ram_bytes": 8 << 30, "disk_free_bytes": 100 << 30}


def register_body(account: LocalAccount, **overrides: Any) -> dict[str, Any]:
    return {"address": account.address, "specs": SPECS, "client_version": __version__, **overrides}


def heartbeat_body(account: LocalAccount, **overrides: Any) -> dict[str, Any]:
    return {"address": account.address, "client_version": __version__, "activity": "idle", "metrics": {}, **overrides}


def signed_post(
    url: str,
    path: str,
    account: LocalAccount,
    audience: str,
    body: dict[str, Any] | bytes,
    *,
    query: str = "",
    timestamp: int | None = None,
    nonce: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    signed = sign_request(account, "POST", path, query, raw, audience, timestamp=timestamp, nonce=nonce)
    full_path = f"{path}?{query}" if query else path
    return HTTP.post(url + full_path, content=raw, headers={"content-type": "application/json", **signed, **(headers or {})})


@contextmanager
def hung_up(url: str, path: str, account: LocalAccount, audience: str, body: dict[str, Any]) -> Iterator[None]:
    """A signed POST of ``body`` to ``path`` on a socket of its own, closed unanswered when the block ends: a client
    that stopped while its long poll waited."""
    raw = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    headers = {"content-type": "application/json", "content-length": str(len(raw)), "host": host}
    headers |= sign_request(account, "POST", path, "", raw, audience)
    with socket.create_connection((host, int(port))) as connection:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        connection.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + raw)
        yield


def make_run(
    served,
    *,
    name: str = "r",
    sampling: SamplingParams = SamplingParams(max_tokens=8),
    prompts: int = 2,
    samples: int = 2,
    audit: AuditPolicy | None = None,
    min_stake: int = 0,
    outer: OuterSettings | None = None,
    async_level: int = 2,
    model: str = DEFAULT_MODEL,
    environment: str = "arithmetic",
) -> str:
    """A run of the arithmetic environment (on the tiny model unless ``model``), small enough for a test's patience."""
    with make_sessionmaker(served.engine).begin() as session:
        spec = RunSpec(
            name=name,
            model=model,
            environment=environment,
            sampling=sampling,
            prompts_per_task=prompts,
            samples_per_prompt=samples,
            audit=audit,
            min_stake=min_stake,
            outer=outer,
            async_level=async_level,
        )
        run = create_run(session, spec, datetime.now(UTC))
        return run.id


def verdict_body(
    audience: str, validator: LocalAccount, claim: dict[str, Any], checks: list[dict[str, Any]], untrained_rows: list[int] = ()
) -> dict[str, Any]:
    """A verdict on a claimed submission, signed over its file and checks as a validator must."""
    rows = list(untrained_rows)
    outcomes = [CheckOutcome.model_validate(c) for c in checks]
    signature = sign_verdict(validator, audience, claim["submission_id"], claim["sha256"], outcomes, rows)
    return {
        "address": validator.address,
        "submission_id": claim["submission_id"],
        "checks": checks,
        "untrained_rows": rows,
        "signature": signature,
    }


def expire_assignments(served, submission_id: str) -> None:
    """End every open assignment to judge ``submission_id`` now, as if its validator had gone silent."""
    from sqlalchemy import update

    from intellect_protocol.coordinator.models import Review

    with make_sessionmaker(served.engine).begin() as session:
        session.execute(
            update(Review)
            .where(Review.submission_id == submission_id, Review.outcome.is_(None))
            .values(expires_at=datetime(2000, 1, 1, tzinfo=UTC))
        )


def checks_for(outcome: str) -> list[dict[str, Any]]:
    """A verdict's checks saying ``outcome`` (see :func:`devnet.rogue_validator.made_up_checks`), as JSON."""
    from intellect_protocol.devnet.rogue_validator import made_up_checks

    return [c.model_dump() for c in made_up_checks(outcome)]


def chromium() -> str:
    """Debian's headless Chromium for playwright; CI must have it, elsewhere its absence skips."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing; .ci/run must install it (apt-get install chromium).")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return found


def running_under(workdir: Path) -> list[str]:
    """Command lines of live processes that mention ``workdir``: what a stop left behind."""
    left = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and str(workdir) in cmdline and int(proc.name) != os.getpid():
            left.append(cmdline)
    return left


def wait_for_text(path: Path, text: str, timeout: float) -> None:
    """Return once the file at ``path`` holds ``text``; fail showing its tail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(
        f"{path.name} never said {text!r}:\n{path.read_text(errors='replace')[-3000:] if path.exists() else '(no log)'}"
    )


EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "environments"


def install_example_environment(where: Path, example: str = "column-credit") -> dict[str, str]:
    """pip-install an example environment plugin into ``where`` (outside the test environment's site-packages,
    so only processes started with the returned variables see it); returns those variables."""
    import subprocess
    import sys

    source = where / "source"
    shutil.copytree(EXAMPLES / example, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = where / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``, read from /proc (Linux)."""
    try:
        children = {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()
    return children.union(*(descendants(c) for c in children))


def private_mib(pid: int) -> int:
    """Memory that process ``pid`` holds for itself, not shared with another (Linux), in MiB."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    return sum(int(line.split()[1]) for line in rollup if line.startswith("Private_")) // 1024


def install_distribution(root: Path, package: str, release: str, entries: dict[str, str], module: str = "") -> None:
    """Install a distribution by hand, as pip lays one out: a module and a ``.dist-info`` with its entry points."""
    root.mkdir(parents=True, exist_ok=True)
    if module:
        (root / f"{package.replace('-', '_')}.py").write_text(module)
    info = root / f"{package.replace('-', '_')}-{release}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {release}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[intellect_protocol.environments]\n{lines}")


@contextmanager
def installed_environment(site: Path, package: str, name: str, target: str, module: str) -> Iterator[Environment]:
    """``module`` installed in ``site`` as ``package`` 0.1.0, with the environment ``name`` at ``target``, importable while
    the block runs (the roles' reward processes start with this process's path): the environment."""
    install_distribution(site, package, "0.1.0", {name: target}, module)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        yield get_environment(name, plugin(name).pin)
