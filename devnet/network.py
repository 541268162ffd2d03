"""A whole network on loopback, one process per role, with fresh wallets and granted roles:
the coordinator, the trainer's shardcast origin, a relay, validators (two by default: nobody is
trusted alone), the trainer and N nodes.

Used by ``intellect-devnet`` and by the tests that prove the network learns.
"""

from __future__ import annotations

import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from intellect_protocol.devnet.certificates import Authority, ServerFiles
from intellect_protocol.devnet.processes import (
    Process,
    StartError,
    admin_token,
    create_run,
    free_port,
    migrate,
    script,
    spawn,
    start_coordinator,
    start_node,
    start_relay,
)
from intellect_protocol.shared.tls import CA_FILE_ENV, client_context
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet, wallet_address

if TYPE_CHECKING:
    from rich.console import Console

    from intellect_protocol.devnet.chain import DevChain


@dataclass
class Network:
    workdir: Path
    database_url: str
    token: str
    run_id: str
    password: str
    processes: list[Process] = field(default_factory=list)
    chain: DevChain | None = None
    """Settlement on a local chain (``--chain``): every node and validator staked before it asks for work."""
    authority: Authority | None = None
    """With ``--tls``: the local CA that signed every server's certificate, which every client trusts."""
    http: httpx.Client = field(init=False, repr=False)
    """For everything the devnet asks the coordinator: one client, because each new one builds a TLS
    context (about 25 ms of CPU) even for plain HTTP, and the dashboard and the chaos checks poll."""

    def __post_init__(self) -> None:
        self.http = httpx.Client(verify=client_context(self.authority.cert if self.authority else None))

    def role_env(self) -> dict[str, str]:
        """What every role's process is started with: its wallet's password and, with TLS, the CA it trusts."""
        return {"INTELLECT_WALLET_PASSWORD": self.password} | ({CA_FILE_ENV: str(self.authority.cert)} if self.authority else {})

    def server_tls(self, name: str) -> ServerFiles | None:
        """A certificate for the server ``name`` on loopback, signed by the devnet's CA (None without TLS)."""
        return self.authority.issue(self.workdir / "tls", name) if self.authority else None

    @property
    def coordinator(self) -> Process:
        return self.processes[0]

    def by_name(self, name: str) -> Process:
        return next(p for p in self.processes if p.name == name)

    def wallet(self, name: str) -> tuple[Path, str]:
        path = self.workdir / "wallets" / f"{name}.json"
        return path, create_wallet(path, self.password, scrypt_n=THROWAWAY_SCRYPT_N)

    def grant(self, address: str, role: str) -> None:
        reply = self.http.post(
            f"{self.coordinator.url}/v1/admin/roles",
            json={"address": address, "role": role},
            headers={"authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        reply.raise_for_status()

    def staked_wallet(self, name: str) -> tuple[Path, str]:
        """A fresh wallet for a node or a validator, staked when the network settles on a chain."""
        wallet, address = self.wallet(name)
        if self.chain is not None:
            self.chain.stake(wallet, self.password)
        return wallet, address

    def start_adversary(self) -> str:
        """A node that uploads forged rollouts (caught, banned, and slashed on a chain); its address."""
        wallet, _ = self.staked_wallet("adversary")
        command = [
            sys.executable,
            "-m",
            "intellect_protocol.devnet.adversary",
            "--wallet",
            str(wallet),
            "--coordinator",
            str(self.coordinator.url),
        ]
        command += ["--state-dir", str(self.workdir / "state" / "adversary")]
        self.processes.append(spawn("adversary", command, self.workdir / "logs" / "adversary.log", self.role_env()))
        return wallet_address(wallet)

    def validators(self) -> list[Process]:
        return [p for p in self.processes if p.name.startswith("validator-")]

    def stop(self, timeout: float = 8, console: Console | None = None) -> dict[str, int | None]:
        """SIGTERM to every process at once, SIGKILL to what still runs after ``timeout``; exit codes by
        name, and each role it had to kill named on ``console`` with its log. The default outlasts a node's
        own deadline for stopping (6 s), so a loaded node winding down exits by itself rather than killed."""
        for p in self.processes:
            if p.popen.poll() is None:
                p.popen.terminate()
        deadline = time.monotonic() + timeout
        codes = {p.name: p.stop(max(0.1, deadline - time.monotonic())) for p in reversed(self.processes)}
        for p in self.processes:
            if console is not None and codes[p.name] == -signal.SIGKILL:
                console.print(
                    f"{p.name} did not stop within the devnet's deadline and was killed (its log: {p.log_path}).",
                    style="yellow",
                    markup=False,
                )
        return codes


def start_validator(net: Network, name: str) -> Process:
    """A validator with a fresh wallet (staked on a chain, as runs there ask), granted the role, checking until stopped."""
    wallet, address = net.staked_wallet(name)
    net.grant(address, "validator")
    command = [*script("intellect-validator"), "run", "--wallet", str(wallet), "--coordinator", str(net.coordinator.url)]
    command += ["--state-dir", str(net.workdir / "state" / name)]
    return spawn(name, command, net.workdir / "logs" / f"{name}.log", net.role_env())


def start_islands(net: Network, count: int, sync_every: int, trainer: list[str], env: dict[str, str]) -> list[Process]:
    """A lighthouse and ``count`` trainer islands (``island-0`` ...), each with a wallet granted the trainer
    role and a checkpoint directory of its own, publishing into the one origin directory ``trainer`` names.
    Each inner step takes an island's share of the groups a lone trainer's step would, so a policy step
    (``sync_every`` inner steps on every island) learns from as many groups as a lone trainer's."""
    from intellect_protocol.trainer.settings import TrainerSettings  # imports torch: only for islands

    groups = max(1, TrainerSettings().groups_per_step // (count * sync_every))
    env = {"INTELLECT_TRAINER_GROUPS_PER_STEP": str(groups), **env}
    port = free_port()
    lighthouse = [*script("intellect-trainer"), "lighthouse", "--bind", f"127.0.0.1:{port}", "--join-timeout-s", "3"]
    processes = [spawn("lighthouse", lighthouse, net.workdir / "logs" / "lighthouse.log")]
    for i in range(count):
        name = f"island-{i}"
        wallet, address = net.wallet(name)
        net.grant(address, "trainer")
        command = [*trainer, "--wallet", str(wallet), "--checkpoint-dir", str(net.workdir / name)]
        command += ["--island", name, "--lighthouse", f"http://127.0.0.1:{port}"]
        processes.append(spawn(name, command, net.workdir / "logs" / f"{name}.log", env))
    return processes


RUN_NAME = "devnet-arithmetic"


def _holds_run(database_url: str, name: str) -> bool:
    from sqlalchemy import create_engine, select

    from intellect_protocol.coordinator.models import Run

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.scalar(select(Run.id).where(Run.name == name)) is not None
    finally:
        engine.dispose()


def start_network(
    workdir: Path,
    *,
    nodes: int = 2,
    validators: int = 2,
    database_url: str | None = None,
    run_options: list[str] = (),  # type: ignore[assignment]
    coordinator_env: dict[str, str] | None = None,
    trainer_env: dict[str, str] | None = None,
    node_env: dict[str, str] | None = None,
    steps: int = 0,
    keep_steps: int = 3,
    chain: DevChain | None = None,
    tls: bool = False,
    islands: int = 0,
    sync_every: int = 1,
    run_name: str = RUN_NAME,
) -> Network:
    """Start every role; on a failure, stop what started and raise :class:`StartError` naming the process.

    ``steps``: the trainer stops after publishing this policy step (0: never); ``keep_steps``:
    how many policy steps the origin and relay keep: the default run's async level (2) + 1, so
    every step a task may still use stays downloadable (more to evaluate a whole run afterwards);
    ``chain``: settle on it (the run asks for a stake, credit turns final within seconds);
    ``tls``: every server presents a certificate of a CA made in ``workdir/tls``, every client verifies it;
    ``islands``: that many trainer islands and their lighthouse instead of one trainer, the run meeting
    every ``sync_every`` inner steps; ``run_name``: the run's (a ledger that holds it already is refused).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    database_url = database_url or f"sqlite:///{workdir / 'ledger.db'}"
    migrate(database_url, workdir / "logs" / "migrate.log")
    if _holds_run(database_url, run_name):
        raise StartError(
            f"The ledger at {database_url} already holds an earlier devnet's run ({run_name!r}); nothing was added to it. "
            "Give this devnet a database of its own, or leave out --database-url (SQLite in the workdir)."
        )
    token = admin_token(database_url)
    (workdir / "admin-token").write_text(token + "\n")
    if chain is not None:
        from intellect_protocol.devnet.chain import DISPUTE_WINDOW_S, MIN_STAKE_TOKENS

        run_options = [*run_options, "--min-stake", str(MIN_STAKE_TOKENS), "--dispute-window", str(DISPUTE_WINDOW_S)]
        coordinator_env = {**chain.coordinator_env, **(coordinator_env or {})}
    run_id = create_run(database_url, run_name, workdir / "logs" / "run.log", run_options, workdir / "blobs")
    password = secrets.token_urlsafe(16)
    (workdir / "wallet-password").write_text(password + "\n")
    authority = Authority.create(workdir / "tls") if tls else None
    net = Network(workdir, database_url, token, run_id, password, chain=chain, authority=authority)
    try:
        env = {"INTELLECT_BLOB_DIR": str(workdir / "blobs"), **(coordinator_env or {})}
        net.processes.append(start_coordinator(workdir, database_url, env=env, tls=net.server_tls("coordinator")))
        url = net.coordinator.url
        if url is None:
            raise StartError("the coordinator started without a URL")

        origin_wallet, origin_address = net.wallet("origin")
        relay_wallet, relay_address = net.wallet("relay")
        trainer_wallet, trainer_address = net.wallet("trainer")
        grants = {origin_address: "relay", relay_address: "relay", trainer_address: "trainer"}
        for address, role in grants.items():
            net.grant(address, role)

        keep = ["--keep", str(keep_steps)]
        origin = start_relay(
            workdir, "origin", origin_wallet, password, url, origin=True, extra=keep, tls=net.server_tls("origin")
        )
        net.processes.append(origin)
        upstreams = [origin.url or ""]
        net.processes.append(
            start_relay(
                workdir, "relay", relay_wallet, password, url, upstreams=upstreams, extra=keep, tls=net.server_tls("relay")
            )
        )
        for i in range(validators):
            net.processes.append(start_validator(net, f"validator-{i}"))
        trainer = [*script("intellect-trainer"), "run", "--coordinator", url, "--run", run_id, "--steps", str(steps)]
        trainer += ["--origin-dir", str(workdir / "origin")]
        trainer_env = {**net.role_env(), "INTELLECT_TRAINER_THREADS": "1", **(trainer_env or {})}
        if islands:
            net.processes.extend(start_islands(net, islands, sync_every, trainer, trainer_env))
        else:
            trainer += ["--wallet", str(trainer_wallet), "--checkpoint-dir", str(workdir / "trainer")]
            net.processes.append(spawn("trainer", trainer, workdir / "logs" / "trainer.log", trainer_env))
        for i in range(nodes):
            wallet = net.staked_wallet(f"node-{i}")[0]
            net.processes.append(start_node(workdir, f"node-{i}", wallet, url, password, {**net.role_env(), **(node_env or {})}))
        if chain is not None:
            net.processes.append(chain.anvil)
    except BaseException:
        net.stop()
        raise
    return net
