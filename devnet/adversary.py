"""A node that cheats, for ``intellect-devnet --adversary``: it registers like any node, leases
tasks, and uploads random tokens proven with one prefill of the real model (TOPLOC alone would
pass them; the validator's sampling check does not). Watch its rejections, strikes and ban.

    python -m intellect_protocol.devnet.adversary --wallet FILE --coordinator URL   (password: INTELLECT_WALLET_PASSWORD)
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from intellect_protocol.node.client import NodeClient, NodeError, TaskLost
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.inference import prefill
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.rollout_file import Rollout, read_rollouts, write_rollouts
from intellect_protocol.shared.schemas import TaskSpec, WorkWait
from intellect_protocol.shared.toploc import build_proofs
from intellect_protocol.shared.wallet import load_wallet, read_password


def prove_with(model: torch.nn.Module, eos: int, r: Rollout, tokens: list[int]) -> None:
    """What a forger does: take tokens from anywhere, then prove them with one prefill of ``model``."""
    hidden, logits = prefill(model, r.prompt_tokens, tokens)
    r.completion_tokens = tokens
    r.proofs = build_proofs(hidden)
    r.logprobs = logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    r.finish_reason = "stop" if tokens[-1] == eos else "length"


def forge(task: TaskSpec) -> bytes:
    """An honest-looking file for ``task`` whose completions are random tokens."""
    model, tokenizer = load_model(task.model)
    rollouts = read_rollouts(finish(generate(task)).data)
    rng = random.Random(task.seed)
    for r in rollouts:
        prove_with(
            model, tokenizer.eos_token_id, r, [rng.randrange(3, tokenizer.vocab_size) for _ in range(task.sampling.max_tokens)]
        )
    return write_rollouts(rollouts)


def cheat(client: NodeClient, forged: Callable[[TaskSpec], bytes]) -> None:
    """Lease tasks and upload ``forged(task)`` for each, until the network bans this node."""
    try:
        while True:
            task = client.lease()
            if isinstance(task, WorkWait):
                time.sleep(1)
                continue
            try:
                receipt = client.submit(task.task_id, forged(task))
            except TaskLost:
                continue  # a ban ends its leases at once, so an upload can find its lease gone: the next lease says why
            print(f"uploaded forged rollouts for {task.task_id} as {receipt.submission_id}", flush=True)
    except NodeError as e:
        print(f"stopped: {e}", flush=True)  # banned: the point of the demonstration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wallet", type=Path, required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--state-dir", type=Path, default=Path("adversary-state"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    account = load_wallet(args.wallet, read_password())
    client = NodeClient(args.coordinator, account, NodeSettings(state_dir=args.state_dir), stop=threading.Event())
    client.public_status()
    client.register(probe(args.state_dir), None)
    # Policy steps after 0 would need the real weights; this cheater proves with the base model regardless.
    cheat(client, lambda task: forge(task.model_copy(update={"model": "tiny-arith"})))


if __name__ == "__main__":
    main()
