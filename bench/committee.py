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

Part 3, an appeal flood. Hundreds of fresh wallets each get a file rejected by two of three
validators, then all appeal at once (the third could hear them). Meanwhile an honest node uploads;
three scripted validators (a fixed 20 ms per verdict) judge whatever is drawn for them. Honest
validation latency (upload to decision) p50/p99, with the flood and without it (the baseline).

Part 4, forged rows trained per rogue grant, at the default audit policy. Three validators are
drawn at random: two honest, one rogue that judges honestly until it is trusted (20 verdicts),
then approves its accomplice's forgeries until its first strike. The accomplice first earns 20
honest acceptances, then forges every file (4 prompts x 4 samples: 16 rows). A trainer reads
accepted work as fast as it appears. Per grant (a fresh rogue and accomplice each time): forged
rows the trainer read. Goal: at most 16.

    python bench/committee.py [--tasks 24] [--verdicts 1000] [--wallets 200] [--grants 10] [--parts 1,2,3,4]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import torch
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from devnet.processes import admin_token, migrate, start_coordinator  # noqa: E402
from devnet.rogue_validator import made_up_checks  # noqa: E402
from node.work import finish, generate  # noqa: E402
from shared.schemas import PublicStatus, TaskSpec  # noqa: E402
from shared.signing import sign_request  # noqa: E402
from shared.verdicts import sign_verdict  # noqa: E402
from shared.version import __version__  # noqa: E402
from validator.worker import Validator  # noqa: E402

torch.set_num_threads(1)
ENV = {"INTELLECT_RATE_LIMIT_PER_S": "100000", "INTELLECT_RATE_LIMIT_BURST": "100000", "INTELLECT_MAX_VALIDATION_BACKLOG": "100000", "INTELLECT_BACKLOG_FLOOR": "100000"}


@dataclass
class Deployment:
    url: str
    audience: str
    token: str
    run_id: str

    def post(self, account: LocalAccount, path: str, body: dict | bytes, query: str = "") -> httpx.Response:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"content-type": "application/json", **sign_request(account, "POST", path, query, raw, self.audience)}
        reply = httpx.post(self.url + path + (f"?{query}" if query else ""), content=raw, headers=headers, timeout=60)
        if reply.status_code >= 400:
            raise RuntimeError(f"{path}: {reply.status_code} {reply.text}")
        return reply

    def admin(self, method: str, path: str, body: dict | None = None) -> dict | list:
        reply = httpx.request(method, self.url + path, json=body, headers={"authorization": f"Bearer {self.token}"}, timeout=60)
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
        return int(httpx.get(f"{self.url}/v1/public/runs/{self.run_id}/progress", timeout=30).json()["submissions"]["pending"])


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
        d = Deployment(process.url, audience, token, "")
        policy = None if share is None else {"share": share, "new_node_share": share, "suspect_share": share}
        d.run_id = d.admin("POST", "/v1/admin/runs", {"name": "bench", **({"audit": policy} if policy else {}), **run})["id"]  # type: ignore[index,call-overload]
        yield d
    finally:
        process.stop()


class TimedValidator(Validator):
    """The real validator, counting the CPU time its checks take."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.cpu_s = 0.0

    def check(self, claim):  # type: ignore[no-untyped-def]
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
        progress = httpx.get(f"{d.url}/v1/public/runs/{d.run_id}/progress").json()["submissions"]
        rows = progress["accepted"] * 8
        return sum(w.cpu_s for w in workers) / max(rows, 1), sum(w.checked for w in workers), rows


def judge(d: Deployment, validator: LocalAccount, say: Callable[[str], str], pause_s: float = 0.0) -> int:
    claims = d.post(validator, "/v1/validation/claim", {"address": validator.address, "limit": 64}).json()
    for c in claims:
        time.sleep(pause_s)
        verdict = made_up_checks(say(c["submission_id"]))
        signature = sign_verdict(validator, d.audience, c["submission_id"], c["sha256"], verdict, [])
        body = {"address": validator.address, "submission_id": c["submission_id"], "checks": [v.model_dump() for v in verdict], "signature": signature}
        d.post(validator, "/v1/validation/verdicts", body)
    return len(claims)


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
    env = {"INTELLECT_VALIDATOR_LIVE_S": "1", "INTELLECT_VALIDATOR_MAX_STRIKES": str(max_strikes), "INTELLECT_MAX_STRIKES": "1000000"}
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
                given += judge(d, rogue, lambda _: "accept")
            except RuntimeError as e:
                if "role_required" not in str(e):
                    raise
                revoked = True
            while judge(d, first, lambda s: "hard" if s in forged else "accept") + judge(d, second, lambda s: "hard" if s in forged else "accept"):
                pass
        lies = caught = 0
        for offset in range(0, len(forged) * 5 + 1000, 1000):
            for r in d.admin("GET", f"/v1/admin/submissions?limit=1000&offset={offset}"):  # type: ignore[union-attr]
                mine = [v for v in r["verdicts"] if v["validator"] == rogue.address]
                if mine and r["submission_id"] in forged:
                    lies += 1
                    caught += any(v["agreed"] is False or v["voided"] for v in mine)
        # A forgery credited at any time was in the trainer's feed: the trainer may have read it.
        credited = {e["submission_id"] for e in d.admin("GET", "/v1/admin/ledger") if e["kind"] == "credit"}  # type: ignore[union-attr,index]
        return Detection(given, lies, caught, len(credited & forged), revoked)


def raw_post(d: Deployment, account: LocalAccount, path: str, body: dict) -> httpx.Response:
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json", **sign_request(account, "POST", path, "", raw, d.audience)}
    return httpx.post(d.url + path, content=raw, headers=headers, timeout=60)


def decided_in(d: Deployment, ids: list[str]) -> list[float]:
    """Seconds from upload to decision of each of ``ids`` (all decided)."""
    out = []
    for sid in ids:
        r = httpx.get(f"{d.url}/v1/public/submissions/{sid}", timeout=30).json()
        out.append((datetime.fromisoformat(r["validated_at"]) - datetime.fromisoformat(r["created_at"])).total_seconds())
    return out


def appeal_flood(workdir: Path, wallets: int, honest_files: int) -> tuple[list[float], Counter[int]]:
    """Honest validation latencies, and the flood's appeals by answer (none when ``wallets`` is 0)."""
    run = {"prompts_per_task": 1, "samples_per_prompt": 1, "sampling": {"temperature": 1.0, "max_tokens": 4}}
    env = {"INTELLECT_REGISTRATIONS_PER_IP_PER_HOUR": "100000", "INTELLECT_MAX_STRIKES": "1000000"}
    with deployment(workdir, 1.0, run, env) as d:
        validators = [Account.create() for _ in range(3)]
        for v in validators:
            d.grant(v, "validator")
        flood = {}
        for _ in range(wallets):
            w = d.node()
            flood[d.submit(w)] = w
        while sum(judge(d, v, lambda _: "soft") for v in validators):
            pass
        answers: Counter[int] = Counter()
        with ThreadPoolExecutor(16) as pool:
            for reply in pool.map(lambda item: raw_post(d, item[1], "/v1/appeals", {"address": item[1].address, "submission_id": item[0]}), flood.items()):
                answers[reply.status_code] += 1
        honest, stop = d.node(), threading.Event()

        def work(v: LocalAccount) -> None:
            while not stop.is_set():
                if not judge(d, v, lambda s: "soft" if s in flood else "accept", pause_s=0.02):
                    time.sleep(0.05)

        threads = [threading.Thread(target=work, args=(v,), daemon=True) for v in validators]
        for t in threads:
            t.start()
        ids = []
        for _ in range(honest_files):
            ids.append(d.submit(honest))
            time.sleep(0.1)
        while any(httpx.get(f"{d.url}/v1/public/submissions/{i}", timeout=30).json()["status"] == "pending" for i in ids):
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        return decided_in(d, ids), answers


def forged_rows_per_grant(workdir: Path, grants: int) -> list[tuple[int, int]]:
    """Per rogue grant: (forgeries the rogue approved, forged rows the trainer read), at the default
    audit policy and run shape."""
    run = {"prompts_per_task": 4, "samples_per_prompt": 4, "sampling": {"temperature": 1.0, "max_tokens": 4}}
    env = {"INTELLECT_REGISTRATIONS_PER_IP_PER_HOUR": "100000"}
    with deployment(workdir, None, run, env) as d:
        honest_validators = [Account.create(), Account.create()]
        for v in honest_validators:
            d.grant(v, "validator")
        trainer = Account.create()
        d.grant(trainer, "trainer")
        honest, cursor, found = d.node(), 0, []
        for _ in range(grants):
            rogue, accomplice = Account.create(), d.node()
            d.grant(rogue, "validator")
            forged: set[str] = set()
            given, trained, banned = 0, 0, False
            while not banned:
                d.submit(honest)
                try:
                    sid = d.submit(accomplice)
                except RuntimeError as e:
                    if "banned" not in str(e):
                        raise
                    banned = True
                    sid = None
                accepted_honestly = int(httpx.get(f"{d.url}/v1/public/nodes/{accomplice.address}", timeout=30).json()["submissions"].get("accepted", 0))
                if sid is not None and accepted_honestly >= 20:
                    forged.add(sid)
                struck = struck_validator(d, rogue)
                lying = given >= 20 and not struck
                given += judge(d, rogue, functools.partial(truth, forged=frozenset(forged), lying=lying))
                for v in honest_validators:
                    judge(d, v, functools.partial(truth, forged=frozenset(forged), lying=False))
                read = trainer_reads(d, trainer, cursor)
                if read:
                    cursor = read[-1]["cursor"]
                    trained += 16 * sum(1 for r in read if r["submission_id"] in forged)
                if struck and not d.pending():
                    break
            lies = sum(
                any(v["validator"] == rogue.address and v["outcome"] == "accept" for v in httpx.get(f"{d.url}/v1/public/submissions/{sid}", timeout=30).json()["verdicts"])
                for sid in forged
            )  # fmt: skip
            found.append((lies, trained))
        return found


def truth(submission_id: str, forged: frozenset[str], lying: bool) -> str:
    return "accept" if lying or submission_id not in forged else "hard"


def struck_validator(d: Deployment, validator: LocalAccount) -> bool:
    standings = httpx.get(f"{d.url}/v1/public/validators", timeout=30).json()
    return any(s["address"] == validator.address and s["strikes"] > 0 for s in standings)


def trainer_reads(d: Deployment, trainer: LocalAccount, after: int) -> list[dict]:
    path, query = "/v1/trainer/rollouts", f"after={after}&limit=500&run={d.run_id}"
    reply = httpx.get(f"{d.url}{path}?{query}", headers=sign_request(trainer, "GET", path, query, b"", d.audience), timeout=60)
    reply.raise_for_status()
    return reply.json()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=24, help="Tasks (8 rows each) per cost configuration.")
    parser.add_argument("--verdicts", type=int, default=1000, help="Rogue verdicts per detection configuration.")
    parser.add_argument("--wallets", type=int, default=200, help="Wallets appealing at once in the flood.")
    parser.add_argument("--honest-files", type=int, default=40, help="Honest files whose validation latency is measured, per flood case.")
    parser.add_argument("--grants", type=int, default=10, help="Rogue validator grants measured in part 4.")
    parser.add_argument("--parts", default="1,2,3,4", help="Which parts to run, e.g. 3,4.")
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if 3 in parts:
            print(f"Part 3: honest validation latency, without and with {args.wallets} wallets appealing at once")
            quiet, _ = appeal_flood(root / "flood-0", 0, args.honest_files)
            loud, answers = appeal_flood(root / "flood-1", args.wallets, args.honest_files)
            print(f"  no flood (baseline): p50 {percentile(quiet, 0.5):.2f} s, p99 {percentile(quiet, 0.99):.2f} s over {len(quiet)} files")
            print(f"  {args.wallets} appeals: answered {dict(sorted(answers.items()))}; honest p50 {percentile(loud, 0.5):.2f} s, p99 {percentile(loud, 0.99):.2f} s")
        if 4 in parts:
            found = forged_rows_per_grant(root / "grants", args.grants)
            rows = [r for _, r in found]
            print(f"Part 4: per rogue grant (default audit policy), forgeries it approved: {[lies for lies, _ in found]}")
            print(f"  forged rows the trainer read: {rows}; mean {statistics.mean(rows):.1f}, max {max(rows)} (goal: at most 16)")
        if 3 in parts:
            print(f"honest validation p99 with the appeal flood / without: x{percentile(loud, 0.99) / percentile(quiet, 0.99):.2f}")
        if not parts & {1, 2}:
            return
        print(f"Part 1: validator CPU per accepted row, {args.tasks} tasks x 8 rows each")
        base, base_verdicts, base_rows = cost(root / "base", 0.0, 1, args.tasks)
        print(f"  one validator (baseline)     {base * 1000:7.2f} ms/row   {base_verdicts} verdicts for {base_rows} rows")
        ratios = {}
        for share in (0.0, 0.1, 1.0):
            per_row, n, rows = cost(root / f"cost-{share}", share, 3, args.tasks)
            ratios[share] = per_row / base
            print(f"  3 validators, audit {share:4.0%}     {per_row * 1000:7.2f} ms/row   {n} verdicts for {rows} rows   x{ratios[share]:.2f} of baseline")

        print(f"\nPart 2: a rogue validator approving everything; 1 in 5 submissions forged; {args.verdicts} of its verdicts")
        for share in (0.0, 0.1, 1.0):
            found = detection(root / f"detect-{share}", share, args.verdicts, max_strikes=10**9)
            per_1000 = 1000 * found.caught / max(found.verdicts, 1)
            print(f"  audit {share:4.0%}: {found.caught} of {found.lies} lies caught ({per_1000:.0f} per 1,000 verdicts, "
                  f"{found.caught / max(found.lies, 1):.0%} of its lies); {found.forged_credited} forgeries credited")  # fmt: skip
        print("  with the default limit of 3 strikes:")
        for share in (0.1, 1.0):
            found = detection(root / f"revoke-{share}", share, args.verdicts, max_strikes=3)
            print(f"  audit {share:4.0%}: revoked={found.revoked} after {found.verdicts} verdicts; "
                  f"{found.forged_credited} of {found.lies} forgeries it approved were credited before it lost its role")  # fmt: skip
    print(f"\nvalidation cost against one trusted validator: audit 0 % x{ratios[0.0]:.2f}, 10 % x{ratios[0.1]:.2f}, 100 % x{ratios[1.0]:.2f}")


if __name__ == "__main__":
    main()
