"""What trusting nobody alone costs, and how fast a rogue validator is caught.

Everything runs through a real coordinator on loopback (SQLite ledger, its own process) with
real signatures; files are made by the node's own code on the shipped tiny model.

Part 1, cost. Honest tasks (2 prompts x 4 samples, up to 32 tokens) are checked by the real
validator (every check, one torch thread). Baseline: one validator, one verdict per submission:
what a single trusted validator costs. Then three validators with the run's audit share at 0 %,
10 % and 100 %. Cost is validator CPU time spent checking (thread time) per accepted rollout row.

Part 2, detection. A rogue validator approves everything and is given the first look at every
submission; one in five is its accomplice's forgery. Two honest validators judge what they are
drawn for by the ground truth (how well real checks find forgeries is bench/verification.py's
question). Per audit share: of the rogue's first ``--verdicts`` verdicts, how many lies were
caught, per 1,000 verdicts and as a share of its lies; then, with the default strike limit (3),
how many verdicts it gave before it lost its role, and how many forgeries were credited (so
readable by the trainer) before that.

    python bench/committee.py [--tasks 24] [--verdicts 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from intellect_protocol.devnet.processes import admin_token, migrate, start_coordinator  # noqa: E402
from intellect_protocol.devnet.rogue_validator import made_up_checks  # noqa: E402
from intellect_protocol.node.work import finish, generate  # noqa: E402
from intellect_protocol.shared.schemas import PublicStatus, TaskSpec  # noqa: E402
from intellect_protocol.shared.signing import sign_request  # noqa: E402
from intellect_protocol.shared.verdicts import sign_verdict  # noqa: E402
from intellect_protocol.shared.version import __version__  # noqa: E402
from intellect_protocol.validator.worker import Validator  # noqa: E402

torch.set_num_threads(1)
ENV = {
    "INTELLECT_RATE_LIMIT_PER_S": "100000",
    "INTELLECT_NEWCOMER_UPLOADS_PER_S": "100000",
    "INTELLECT_RATE_LIMIT_BURST": "100000",
    "INTELLECT_AGGREGATE_READS_PER_S": "100000",
    "INTELLECT_AGGREGATE_READS_BURST": "100000",
    "INTELLECT_MAX_VALIDATION_BACKLOG": "100000",
    "INTELLECT_BACKLOG_FLOOR": "100000",
}


@dataclass
class Deployment:
    url: str
    audience: str
    token: str
    run_id: str
    coordinator_pid: int = 0
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60))
    """One pooled client for every request (a client made per request costs the bench more CPU than the coordinator)."""

    def post(self, account: LocalAccount, path: str, body: dict | bytes, query: str = "") -> httpx.Response:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"content-type": "application/json", **sign_request(account, "POST", path, query, raw, self.audience)}
        reply = self.client.post(self.url + path + (f"?{query}" if query else ""), content=raw, headers=headers)
        if reply.status_code >= 400:
            raise RuntimeError(f"{path}: {reply.status_code} {reply.text}")
        return reply

    def admin(self, method: str, path: str, body: dict | None = None) -> dict | list:
        reply = self.client.request(method, self.url + path, json=body, headers={"authorization": f"Bearer {self.token}"})
        reply.raise_for_status()
        return reply.json()

    def grant(self, account: LocalAccount, role: str) -> None:
        self.admin("POST", "/v1/admin/roles", {"address": account.address, "role": role})

    def node(self) -> LocalAccount:
        account = Account.create()
        specs = {"cpu_cores": 2, "ram_bytes": 8 << 30, "disk_free_bytes": 100 << 30}
        self.post(account, "/v1/nodes/register", {"address": account.address, "specs": specs, "client_version": __version__})
        return account

    def submit(self, node: LocalAccount) -> str:
        task = TaskSpec.model_validate(self.post(node, "/v1/tasks/lease", {"address": node.address}).json())
        return self.post(node, "/v1/submissions", finish(generate(task)).data, f"task={task.task_id}").json()["submission_id"]

    def pending(self) -> int:
        return int(self.client.get(f"{self.url}/v1/public/runs/{self.run_id}/progress").json()["submissions"]["pending"])


@contextmanager
def deployment(workdir: Path, share: float | None, run: dict, env: dict[str, str]) -> Iterator[Deployment]:
    """A coordinator with one run; ``share`` audits everything at that share (None: the default policy)."""
    workdir.mkdir(parents=True)
    url = f"sqlite:///{workdir / 'ledger.db'}"
    migrate(url, workdir / "migrate.log")
    token = admin_token(url)
    process = start_coordinator(workdir, url, env={**ENV, "INTELLECT_BLOB_DIR": str(workdir / "blobs"), **env})
    try:
        assert process.url is not None
        audience = PublicStatus.model_validate(httpx.get(f"{process.url}/v1/public/status").json()).audience
        d = Deployment(process.url, audience, token, "", process.popen.pid)
        policy = None if share is None else {"share": share, "new_node_share": share, "suspect_share": share}
        d.run_id = d.admin("POST", "/v1/admin/runs", {"name": "bench", **({"audit": policy} if policy else {}), **run})["id"]
        yield d
        d.client.close()
    finally:
        process.stop()


class TimedValidator(Validator):
    """The real validator, counting the CPU time its checks take."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cpu_s = 0.0

    def check(self, claim):
        start = time.thread_time()
        try:
            return super().check(claim)
        finally:
            self.cpu_s += time.thread_time() - start


def cost(workdir: Path, share: float, validators: int, tasks: int) -> tuple[float, int, int]:
    """(validator CPU seconds per accepted row, verdicts, accepted rows)."""
    run = {"prompts_per_task": 2, "samples_per_prompt": 4, "sampling": {"temperature": 1.0, "max_tokens": 32}}
    with deployment(workdir, share, run, {}) as d:
        node = d.node()
        for _ in range(tasks):
            d.submit(node)
        accounts = [Account.create() for _ in range(validators)]
        for a in accounts:
            d.grant(a, "validator")
        workers = [TimedValidator(d.url, a, workdir / a.address, Console(quiet=True), batch=4) for a in accounts]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        for t in threads:
            t.start()
        while d.pending():
            time.sleep(0.3)
        for w in workers:
            w.stop.set()
        for t in threads:
            t.join()
        progress = d.client.get(f"{d.url}/v1/public/runs/{d.run_id}/progress").json()["submissions"]
        rows = progress["accepted"] * 8
        return sum(w.cpu_s for w in workers) / max(rows, 1), sum(w.checked for w in workers), rows


def judge(d: Deployment, validator: LocalAccount, say: Callable[[str], str], pause_s: float = 0.0) -> int:
    """Claim once and judge what comes (a newcomer's file or an appeal comes alone); how many."""
    claims = d.post(validator, "/v1/validation/claim", {"address": validator.address, "limit": 64}).json()
    for c in claims:
        time.sleep(pause_s)
        verdict = made_up_checks(say(c["submission_id"]))
        signature = sign_verdict(validator, d.audience, c["submission_id"], c["sha256"], verdict, [])
        body = {
            "address": validator.address,
            "submission_id": c["submission_id"],
            "checks": [v.model_dump() for v in verdict],
            "signature": signature,
        }
        d.post(validator, "/v1/validation/verdicts", body)
    return len(claims)


def judge_all(d: Deployment, validator: LocalAccount, say: Callable[[str], str]) -> int:
    """:func:`judge` until nothing more is drawn for ``validator``; how many."""
    judged = 0
    while claimed := judge(d, validator, say):
        judged += claimed
    return judged


@dataclass
class Detection:
    verdicts: int
    lies: int
    caught: int
    forged_credited: int
    """Forged submissions that held credit at some point: the trainer could have read them."""
    revoked: bool


def detection(workdir: Path, share: float, verdicts: int, max_strikes: int) -> Detection:
    """A rogue that approves everything, given the first look at every submission, for ``verdicts`` verdicts or until revoked."""
    run = {"prompts_per_task": 1, "samples_per_prompt": 1, "sampling": {"temperature": 1.0, "max_tokens": 4}}
    env = {
        "INTELLECT_VALIDATOR_LIVE_S": "1",
        "INTELLECT_VALIDATOR_MAX_STRIKES": str(max_strikes),
        "INTELLECT_MAX_STRIKES": "1000000",
    }
    with deployment(workdir, share, run, env) as d:
        rogue, first, second = Account.create(), Account.create(), Account.create()
        for v in (rogue, first, second):
            d.grant(v, "validator")
        honest, accomplice = d.node(), d.node()
        forged: set[str] = set()
        given, revoked = 0, False
        while given < verdicts and not revoked:
            batch = min(25, verdicts - given)
            for i in range(batch):
                if (given + i) % 5 == 0:
                    forged.add(d.submit(accomplice))
                else:
                    d.submit(honest)
            time.sleep(1.1)  # the honest validators fall out of the draw: the rogue looks first at all of it
            try:
                given += judge_all(d, rogue, lambda _: "accept")
            except RuntimeError as e:
                if "role_required" not in str(e):
                    raise
                revoked = True
            while judge(d, first, lambda s: "hard" if s in forged else "accept") + judge(
                d, second, lambda s: "hard" if s in forged else "accept"
            ):
                pass
        lies = caught = 0
        for offset in range(0, len(forged) * 5 + 1000, 1000):
            for r in d.admin("GET", f"/v1/admin/submissions?limit=1000&offset={offset}"):
                mine = [v for v in r["verdicts"] if v["validator"] == rogue.address]
                if mine and r["submission_id"] in forged:
                    lies += 1
                    caught += any(v["agreed"] is False or v["voided"] for v in mine)
        # A forgery credited at any time was in the trainer's feed: the trainer may have read it.
        credited = {e["submission_id"] for e in d.admin("GET", "/v1/admin/ledger") if e["kind"] == "credit"}
        return Detection(given, lies, caught, len(credited & forged), revoked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=24, help="Tasks (8 rows each) per cost configuration.")
    parser.add_argument("--verdicts", type=int, default=1000, help="Rogue verdicts per detection configuration.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"Part 1: validator CPU per accepted row, {args.tasks} tasks x 8 rows each")
        base, base_verdicts, base_rows = cost(root / "base", 0.0, 1, args.tasks)
        print(f"  one validator (baseline)     {base * 1000:7.2f} ms/row   {base_verdicts} verdicts for {base_rows} rows")
        ratios = {}
        for share in (0.0, 0.1, 1.0):
            per_row, n, rows = cost(root / f"cost-{share}", share, 3, args.tasks)
            ratios[share] = per_row / base
            print(
                f"  3 validators, audit {share:4.0%}     {per_row * 1000:7.2f} ms/row   {n} verdicts for {rows} rows   x{ratios[share]:.2f} of baseline"
            )

        print(f"\nPart 2: a rogue validator approving everything; 1 in 5 submissions forged; {args.verdicts} of its verdicts")
        for share in (0.0, 0.1, 1.0):
            found = detection(root / f"detect-{share}", share, args.verdicts, max_strikes=10**9)
            per_1000 = 1000 * found.caught / max(found.verdicts, 1)
            print(
                f"  audit {share:4.0%}: {found.caught} of {found.lies} lies caught ({per_1000:.0f} per 1,000 verdicts, "
                f"{found.caught / max(found.lies, 1):.0%} of its lies); {found.forged_credited} forgeries credited"
            )
        print("  with the default limit of 3 strikes:")
        for share in (0.1, 1.0):
            found = detection(root / f"revoke-{share}", share, args.verdicts, max_strikes=3)
            print(
                f"  audit {share:4.0%}: revoked={found.revoked} after {found.verdicts} verdicts; "
                f"{found.forged_credited} of {found.lies} forgeries it approved were credited before it lost its role"
            )
    print(
        f"\nvalidation cost against one trusted validator: audit 0 % x{ratios[0.0]:.2f}, 10 % x{ratios[0.1]:.2f}, 100 % x{ratios[1.0]:.2f}"
    )


if __name__ == "__main__":
    main()
