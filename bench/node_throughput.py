"""One node against a local coordinator on the tiny model, end to end, with generation alone
as the baseline measured inside the same tasks.

End to end = the node's own work loop (:class:`node.work_loop.WorkLoop`): lease a task,
generate, score, prove, write the rollout file, sign and upload it (coordinator: SQLite, a
separate process on loopback). Baseline = generation alone (:func:`node.work.generate`) of
the same tasks, run before and after the loop (their mean). The protocol's cost is the end-to-end wall time beyond
that baseline.

    python bench/node_throughput.py [--tasks 20] [--prompts 4] [--samples 4]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import torch
from eth_account import Account
from rich.console import Console

from intellect_protocol.devnet.processes import coordinator_command, migrate, start_coordinator
from intellect_protocol.node.client import NodeClient
from intellect_protocol.node.finishers import finisher_pool
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.work import TaskResult, generate, run_task
from intellect_protocol.node.work_loop import WorkLoop
from intellect_protocol.shared.schemas import TaskSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    quiet = Console(quiet=True)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url = f"sqlite:///{workdir / 'ledger.db'}"
        migrate(url, workdir / "logs" / "migrate.log")
        coordinator_command(
            [
                "run",
                "create",
                "--name",
                "bench",
                "--prompts-per-task",
                str(args.prompts),
                "--samples-per-prompt",
                str(args.samples),
                "--max-tokens",
                "48",
                "--database-url",
                url,
            ]
        )
        # Nothing is validated here, so the node stays a newcomer: lift the newcomers' pace, its uploads are what is measured.
        env = {"INTELLECT_BLOB_DIR": str(workdir / "blobs"), "INTELLECT_NEWCOMER_UPLOADS_PER_S": "1000000"}
        coordinator = start_coordinator(workdir, url, env=env)
        client = NodeClient(coordinator.url, Account.create(), NodeSettings(state_dir=workdir / "node"), stop=threading.Event())
        finishers = finisher_pool()
        try:
            client.public_status()
            client.register(probe(workdir / "node"), None)
            WorkLoop(client, quiet, threading.Event(), idle_wait=0.1, finishers=finishers).run(
                max_tasks=1
            )  # warm-up: loads the model

            # The same shapes as the loop's tasks: the coordinator's cursor moves on, so reuse
            # one leased spec with fresh seeds rather than leasing tasks that would be abandoned.
            template = client.lease()
            assert isinstance(template, TaskSpec), template

            def generation_alone() -> float:
                start = time.perf_counter()
                for i in range(args.tasks):
                    generate(template.model_copy(update={"seed": template.seed + i}))
                return time.perf_counter() - start

            before_s = generation_alone()
            client.submit(template.task_id, run_task(template).data)

            results: list[TaskResult] = []
            start = time.perf_counter()
            loop = WorkLoop(client, quiet, threading.Event(), idle_wait=0.1, on_done=results.append, finishers=finishers)
            loop.run(max_tasks=args.tasks)
            total_s = time.perf_counter() - start
            # The machine is shared: the baseline brackets the measured loop and counts their mean.
            generate_s = (before_s + generation_alone()) / 2
            tokens = sum(r.tokens for r in results)
            rollouts = sum(r.rollouts for r in results)
        finally:
            finishers.shutdown()
            client.close()
            coordinator.stop()

    print(
        f"generation alone: {args.tasks / generate_s:6.2f} tasks/s  ({generate_s:.2f} s for {args.tasks} tasks of the same shape, "
        f"mean of {before_s:.2f} s before and {2 * generate_s - before_s:.2f} s after)"
    )
    print(
        f"end to end:       {args.tasks / total_s:6.2f} tasks/s  ({total_s:.2f} s; {rollouts / total_s:.1f} rollouts/s, "
        f"{tokens / total_s:.0f} tokens/s)"
    )
    in_loop_s = sum(r.generate_s for r in results)
    print(f"generation inside the loop: {in_loop_s:.2f} s ({100 * (in_loop_s - generate_s) / generate_s:+.1f} % vs alone)")
    print(f"protocol cost (target < 10 % of generation time): {100 * (total_s - generate_s) / generate_s:.1f} %")


if __name__ == "__main__":
    main()
