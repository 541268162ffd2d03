"""The accountability layer under attack, against a real coordinator on loopback (its own process,
SQLite, real signatures); validators are scripted (their verdicts by the ground truth), as in
bench/committee.py, whose deployment and judging this reuses.

Part 1, an appeal flood. Hundreds of fresh wallets each get a file rejected by two of three
validators, then all appeal at once (the third could hear them). Meanwhile an honest node uploads;
three scripted validators (a fixed 20 ms per verdict) judge whatever is drawn for them. Honest
validation latency (upload to decision) p50/p99, with the flood and without it (the baseline).

Part 2, forged rows trained per rogue grant, at the default audit policy. Three validators are
drawn at random: two honest, one rogue that judges honestly until it is trusted (20 verdicts),
then approves its accomplice's forgeries until its first strike. The accomplice first earns 20
honest acceptances, then forges every file (4 prompts x 4 samples: 16 rows). A trainer reads
accepted work as fast as it appears. Per grant (a fresh rogue and accomplice each time): forged
rows the trainer read. Goal: at most 16.

Part 3, a sybil flood (round four, item 8). Hundreds of fresh wallets each upload a file forged throughout
(random completions proven with one prefill: devnet.adversary.forge), from ten networks (loopback's /24s) at the
default newcomers' pace, retrying after each 429 as the project's client does, then appeal its rejection, while an
established honest node (files accepted before the clock starts) uploads and three real validators check
everything: the project's `intellect-validator`, each in a process of its own (one torch thread, the shipped tiny
model), as on a network where each has its machine. The sybils run in a process of their own at the lowest CPU
priority (their machines are not the network's). Honest validation latency p50/p99 and the worst file's (200
files by default: of 40, the p99 was the worst one) with the flood and without it (the baseline, measured first in
the same run), the verdicts given, how the appeals were answered, and how busy the coordinator and validators kept
this machine's cores (on one machine they share its cores; on a network, only the coordinator's are shared).
Goal: honest p99 with the flood at most 1.5x without it.

    python bench/accountability.py [--wallets 200] [--honest-files 200] [--grants 10] [--sybils 200]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx
import psutil
from eth_account import Account
from eth_account.signers.local import LocalAccount

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import transformers  # noqa: E402
from committee import Deployment, deployment, judge  # noqa: E402

from intellect_protocol.coordinator.setting_groups import LimitSettings  # noqa: E402
from intellect_protocol.devnet.adversary import forge  # noqa: E402
from intellect_protocol.devnet.processes import Process, script, spawn  # noqa: E402
from intellect_protocol.shared.schemas import TaskSpec  # noqa: E402
from intellect_protocol.shared.signing import sign_request  # noqa: E402
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet  # noqa: E402


def raw_post(d: Deployment, account: LocalAccount, path: str, body: dict) -> httpx.Response:
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json", **sign_request(account, "POST", path, "", raw, d.audience)}
    return d.client.post(d.url + path, content=raw, headers=headers)


def decided(d: Deployment, node: LocalAccount, files: int, pause_s: float = 0.1) -> list[str]:
    """``files`` submissions of ``node``, ``pause_s`` apart, once every one of them is decided."""
    ids = []
    for _ in range(files):
        ids.append(d.submit(node))
        time.sleep(pause_s)
    while any(d.client.get(f"{d.url}/v1/public/submissions/{i}").json()["status"] == "pending" for i in ids):
        time.sleep(0.2)
    return ids


def decided_in(d: Deployment, ids: list[str]) -> list[float]:
    """Seconds from upload to decision of each of ``ids`` (all decided)."""
    out = []
    for sid in ids:
        r = d.client.get(f"{d.url}/v1/public/submissions/{sid}").json()
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
            for reply in pool.map(
                lambda item: raw_post(d, item[1], "/v1/appeals", {"address": item[1].address, "submission_id": item[0]}),
                flood.items(),
            ):
                answers[reply.status_code] += 1
        honest, stop = d.node(), threading.Event()

        def work(v: LocalAccount) -> None:
            while not stop.is_set():
                if not judge(d, v, lambda s: "soft" if s in flood else "accept", pause_s=0.02):
                    time.sleep(0.05)

        threads = [threading.Thread(target=work, args=(v,), daemon=True) for v in validators]
        for t in threads:
            t.start()
        ids = decided(d, honest, honest_files)
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
                accepted_honestly = int(
                    d.client.get(f"{d.url}/v1/public/nodes/{accomplice.address}").json()["submissions"].get("accepted", 0)
                )
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
                any(
                    v["validator"] == rogue.address and v["outcome"] == "accept"
                    for v in d.client.get(f"{d.url}/v1/public/submissions/{sid}").json()["verdicts"]
                )
                for sid in forged
            )
            found.append((lies, trained))
        return found


@dataclass
class Flood:
    latencies: list[float]
    """Honest files' seconds from upload to decision."""
    verdicts: int
    """Verdicts given from the start of the clock until the attack's last appeal was filed."""
    appeals: Counter[int]
    """The sybils' appeals by HTTP status."""
    busy_cores: float
    """CPU the coordinator and the validators used while the honest files were decided, over that wall time."""


def sybil_flood(workdir: Path, sybils: int, honest_files: int) -> Flood:
    """Honest validation while ``sybils`` wallets each upload a forged file and appeal its rejection (none: the
    baseline), three real validators checking."""
    run = {"prompts_per_task": 2, "samples_per_prompt": 4, "sampling": {"temperature": 1.0, "max_tokens": 32}}
    # The newcomers' upload pace at its default (bench/committee.py lifts it for the other parts).
    paced = {"INTELLECT_NEWCOMER_UPLOADS_PER_S": str(LimitSettings.model_fields["newcomer_uploads_per_s"].default)}
    with deployment(workdir, None, run, {"INTELLECT_REGISTRATIONS_PER_IP_PER_HOUR": "100000", **paced}) as d:
        forged = []
        for _ in range(sybils):  # made before anything is timed
            wallet = d.node()
            task = TaskSpec.model_validate(d.post(wallet, "/v1/tasks/lease", {"address": wallet.address}).json())
            forged.append((wallet.key.hex(), task.task_id, forge(task)))
        validators = [start_validator(d, workdir / f"validator-{i}") for i in range(3)]
        spawn = multiprocessing.get_context("spawn")
        ready, go, answers = spawn.Event(), spawn.Event(), spawn.Queue()
        attacker = spawn.Process(target=attack, args=(d.url, d.audience, forged, ready, go, answers))
        attacker.start()
        ready.wait()
        # The honest node is an established one, as most honest work is: files accepted before the clock starts,
        # until every validator has given a verdict (its model loaded).
        honest = d.node()
        while not all(s["verdicts"] for s in d.client.get(f"{d.url}/v1/public/validators").json()):
            decided(d, honest, 1, pause_s=0)
        defenders = [psutil.Process(p.popen.pid) for p in validators] + [psutil.Process(d.coordinator_pid)]
        before, cpu, wall = verdicts_given(d), cpu_s(defenders), time.monotonic()
        go.set()
        ids = decided(d, honest, honest_files)
        busy = (cpu_s(defenders) - cpu) / (time.monotonic() - wall)
        appeals = Counter(answers.get())
        attacker.join()
        given = verdicts_given(d) - before
        for v in validators:
            v.stop()
        return Flood(decided_in(d, ids), given, appeals, busy)


def verdicts_given(d: Deployment) -> int:
    return sum(s["verdicts"] for s in d.client.get(f"{d.url}/v1/public/validators").json())


def cpu_s(processes: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in processes))


def start_validator(d: Deployment, workdir: Path) -> Process:
    """The project's validator in a process of its own (on a network each has its machine), granted the role."""
    wallet = workdir / "wallet.json"
    address = create_wallet(wallet, "bench", scrypt_n=THROWAWAY_SCRYPT_N)
    d.admin("POST", "/v1/admin/roles", {"address": address, "role": "validator"})
    command = [*script("intellect-validator"), "run", "--wallet", str(wallet), "--coordinator", d.url, "--batch", "4"]
    return spawn(
        workdir.name, command + ["--state-dir", str(workdir)], workdir / "validator.log", {"INTELLECT_WALLET_PASSWORD": "bench"}
    )


SYBIL_ADDRESSES = [f"127.0.{n}.1" for n in range(1, 11)]
"""The sybils' client addresses: ten networks, as round four's 200 wallets came from ten addresses."""


def attack(url: str, audience: str, forged: list[tuple[str, str, bytes]], ready: Event, go: Event, answers: Queue) -> None:
    """The sybils, in a process of their own: each uploads its forged file, waits for the verdict, and appeals.
    Their client runs at the lowest CPU priority: on a network the attacker's machines are its own, so what is
    measured is the load its requests put on the coordinator and the validators, not its client's share of this one."""
    os.nice(19)
    # As in round four, from ten networks (loopback's /24s), each held to the newcomers' upload pace at its default.
    networks = [
        Deployment(url, audience, "", "", client=httpx.Client(timeout=60, transport=httpx.HTTPTransport(local_address=ip)))
        for ip in SYBIL_ADDRESSES
    ]
    ready.set()
    go.wait()
    answered: Counter[int] = Counter()

    def one(n: int, key: str, task_id: str, data: bytes) -> None:
        wallet, d = Account.from_key(key), networks[n % len(networks)]
        path, query = "/v1/submissions", f"task={task_id}"
        while True:  # as the project's client does: again after the Retry-After of a 429
            headers = sign_request(wallet, "POST", path, query, data, d.audience)
            reply = d.client.post(f"{d.url}{path}?{query}", content=data, headers=headers)
            if reply.status_code != 429:
                break
            time.sleep(float(reply.headers["retry-after"]))
        reply.raise_for_status()
        sid = reply.json()["submission_id"]
        while d.client.get(f"{d.url}/v1/public/submissions/{sid}").json()["status"] == "pending":
            time.sleep(0.5)
        answered[raw_post(d, wallet, "/v1/appeals", {"address": wallet.address, "submission_id": sid}).status_code] += 1

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: one(*item), ((n, *f) for n, f in enumerate(forged))))
    answers.put(dict(answered))


def truth(submission_id: str, forged: frozenset[str], lying: bool) -> str:
    return "accept" if lying or submission_id not in forged else "hard"


def struck_validator(d: Deployment, validator: LocalAccount) -> bool:
    standings = d.client.get(f"{d.url}/v1/public/validators").json()
    return any(s["address"] == validator.address and s["strikes"] > 0 for s in standings)


def trainer_reads(d: Deployment, trainer: LocalAccount, after: int) -> list[dict]:
    path, query = "/v1/trainer/rollouts", f"after={after}&limit=500&run={d.run_id}"
    reply = d.client.get(f"{d.url}{path}?{query}", headers=sign_request(trainer, "GET", path, query, b"", d.audience))
    reply.raise_for_status()
    return reply.json()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steady(name: str, latencies: list[float]) -> list[float]:
    """``latencies`` of a baseline, refused when its own spread says the machine was busy (p99 over 10x p50)."""
    if percentile(latencies, 0.99) > 10 * percentile(latencies, 0.5):
        raise SystemExit(
            f"{name}: p99 {percentile(latencies, 0.99):.2f} s against p50 {percentile(latencies, 0.5):.2f} s (a busy machine?)"
        )
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wallets", type=int, default=200, help="Wallets appealing at once in the flood.")
    parser.add_argument(
        "--honest-files", type=int, default=200, help="Honest files whose validation latency is measured, per flood case."
    )
    parser.add_argument("--grants", type=int, default=10, help="Rogue validator grants measured in part 2.")
    parser.add_argument("--sybils", type=int, default=200, help="Wallets uploading a forged file and appealing in part 3.")
    parser.add_argument("--parts", default="1,2,3", help="Which parts to run, comma-separated.")
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()  # one bar per forged file's model load otherwise
    parts, ratios = {int(p) for p in args.parts.split(",")}, []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if 1 in parts:
            print(f"Part 1: honest validation latency, without and with {args.wallets} wallets appealing at once")
            quiet = steady("part 1's baseline", appeal_flood(root / "flood-0", 0, args.honest_files)[0])
            loud, answers = appeal_flood(root / "flood-1", args.wallets, args.honest_files)
            print(
                f"  no flood (baseline): p50 {percentile(quiet, 0.5):.2f} s, p99 {percentile(quiet, 0.99):.2f} s over {len(quiet)} files"
            )
            print(
                f"  {args.wallets} appeals: answered {dict(sorted(answers.items()))}; "
                f"honest p50 {percentile(loud, 0.5):.2f} s, p99 {percentile(loud, 0.99):.2f} s"
            )
            ratios.append(
                f"honest validation p99 with the appeal flood / without: x{percentile(loud, 0.99) / percentile(quiet, 0.99):.2f}"
            )
        if 2 in parts:
            found = forged_rows_per_grant(root / "grants", args.grants)
            rows = [r for _, r in found]
            print(f"Part 2: per rogue grant (default audit policy), forgeries it approved: {[lies for lies, _ in found]}")
            print(f"  forged rows the trainer read: {rows}; mean {statistics.mean(rows):.1f}, max {max(rows)} (goal: at most 16)")
        if 3 in parts:
            print(
                f"Part 3: honest validation latency (real validators), without and with {args.sybils} sybils' forged files and appeals"
            )
            calm = sybil_flood(root / "sybils-0", 0, args.honest_files)
            steady("part 3's baseline", calm.latencies)
            storm = sybil_flood(root / "sybils-1", args.sybils, args.honest_files)
            for name, flood in (("no sybils (baseline)", calm), (f"{args.sybils} sybils", storm)):
                print(
                    f"  {name}: honest p50 {percentile(flood.latencies, 0.5):.2f} s, p99 {percentile(flood.latencies, 0.99):.2f} s, "
                    f"worst {max(flood.latencies):.2f} s of {len(flood.latencies)}; "
                    f"{flood.verdicts} verdicts; coordinator and validators busy {flood.busy_cores:.2f} cores of {os.cpu_count()}"
                )
            print(f"  the sybils' appeals answered {dict(sorted(storm.appeals.items()))}")
            ratio = percentile(storm.latencies, 0.99) / percentile(calm.latencies, 0.99)
            ratios.append(f"honest validation p99 with the sybil flood / without: x{ratio:.2f} (goal: at most 1.5x)")
    for line in ratios:
        print(line)


if __name__ == "__main__":
    main()
