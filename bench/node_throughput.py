"""One node against a local coordinator on the tiny model, end to end, with generation alone
as the baseline measured inside the same tasks.

End to end = lease a task, generate, score, prove, write the rollout file, sign and upload
it (coordinator: SQLite, a separate process on loopback). The protocol's cost is the time
that is not generation.

    python bench/node_throughput.py [--tasks 20] [--prompts 4] [--samples 4]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch
from eth_account import Account

from devnet.processes import migrate, script, start_coordinator
from node.client import CoordinatorClient
from node.hardware import probe
from node.settings import NodeSettings
from node.work import run_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url = f"sqlite:///{workdir / 'ledger.db'}"
        migrate(url, workdir / "logs" / "migrate.log")
        subprocess.run(
            [*script("intellect-coordinator"), "run", "create", "--name", "bench", "--prompts-per-task", str(args.prompts),
             "--samples-per-prompt", str(args.samples), "--max-tokens", "48", "--database-url", url],
            check=True, capture_output=True,
        )  # fmt: skip
        coordinator = start_coordinator(workdir, url, env={"INTELLECT_BLOB_DIR": str(workdir / "blobs")})
        client = CoordinatorClient(
            coordinator.url, Account.create(), NodeSettings(state_dir=workdir / "node"), stop=threading.Event()
        )
        try:
            client.public_status()
            client.register(probe(workdir / "node"), None)
            run_task(client.lease())  # warm-up: loads the model; that task is simply not submitted

            generate_s = tokens = rollouts = 0.0
            start = time.perf_counter()
            for _ in range(args.tasks):
                task = client.lease()
                result = run_task(task)
                client.submit(task.task_id, result.data)
                generate_s += result.generate_s
                tokens += result.tokens
                rollouts += result.rollouts
            total_s = time.perf_counter() - start
        finally:
            client.close()
            coordinator.stop()

    print(
        f"end to end:       {rollouts / total_s:7.1f} rollouts/s  {tokens / total_s:8.1f} tokens/s  ({total_s:.2f} s for {args.tasks} tasks)"
    )
    print(f"generation alone: {rollouts / generate_s:7.1f} rollouts/s  {tokens / generate_s:8.1f} tokens/s  ({generate_s:.2f} s)")
    print(f"protocol cost (target < 10 % of generation time): {100 * (total_s - generate_s) / generate_s:.1f} %")


if __name__ == "__main__":
    main()
