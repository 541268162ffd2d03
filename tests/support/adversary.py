"""A malicious node's toolbox: each attack rewrites an honest rollout file the way a cheater
would, through the real file format. Shared by the checks' unit tests and the API-level suite."""

from __future__ import annotations

import random
from functools import cache

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from intellect_protocol.devnet.adversary import prove_with
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.inference import prefill
from intellect_protocol.shared.models import TINY_MODEL_DIR, load_model
from intellect_protocol.shared.rollout_file import Rollout, read_rollouts
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.shared.toploc import build_proofs


@cache
def tiny() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The shipped model and its tokenizer, loaded once per process when a test first needs them."""
    return load_model("tiny-arith")


def prove_with_real_model(r: Rollout, tokens: list[int]) -> None:
    """What a forger does: take tokens from anywhere, then prove them with one prefill of the real model."""
    model, tokenizer = tiny()
    prove_with(model, tokenizer.eos_token_id, r, tokens)


def other_model() -> torch.nn.Module:
    torch.manual_seed(7)
    config = AutoModelForCausalLM.from_pretrained(TINY_MODEL_DIR).config
    return AutoModelForCausalLM.from_config(config).eval()


def other_model_tokens(rollouts: list[Rollout], task: TaskSpec) -> None:
    model = other_model()
    for r in rollouts:
        ids = torch.tensor([r.prompt_tokens])
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=task.sampling.max_tokens, do_sample=False
            )
        prove_with_real_model(r, out[0, len(r.prompt_tokens) :].tolist())


def random_tokens(rollouts: list[Rollout], task: TaskSpec) -> None:
    rng = random.Random(0)
    for r in rollouts:
        prove_with_real_model(r, [rng.randrange(3, tiny()[1].vocab_size) for _ in range(task.sampling.max_tokens)])


def edited_after_proof(rollouts: list[Rollout], task: TaskSpec) -> None:
    for r in rollouts:
        k = len(r.completion_tokens) // 3
        r.completion_tokens[k] = (r.completion_tokens[k] + 1) % tiny()[1].vocab_size or 3


def inflated_rewards(rollouts: list[Rollout], task: TaskSpec) -> None:
    rollouts[0].reward += 1.0
    rollouts[0].task_reward += 1.0


def other_prompts(rollouts: list[Rollout], task: TaskSpec) -> None:
    easy = tiny()[1].encode("1+1=", add_special_tokens=False)
    rollouts[0].prompt_tokens = [tiny()[1].bos_token_id, *easy] if tiny()[1].bos_token_id is not None else easy


def cut_short(rollouts: list[Rollout], task: TaskSpec) -> None:
    for r in rollouts:
        prove_with_real_model(r, r.completion_tokens[:5])
        r.finish_reason = "length"


def truncated_proofs(rollouts: list[Rollout], task: TaskSpec) -> None:
    rollouts[0].proofs = rollouts[0].proofs[:-7]


def garbled_proofs(rollouts: list[Rollout], task: TaskSpec) -> None:
    rollouts[1].proofs = b"\xff" * len(rollouts[1].proofs)


def proofs_from_another_model(rollouts: list[Rollout], task: TaskSpec) -> None:
    model = other_model()
    for r in rollouts:
        hidden, _ = prefill(model, r.prompt_tokens, r.completion_tokens)
        r.proofs = build_proofs(hidden)


def replayed_from_another_task(rollouts: list[Rollout], task: TaskSpec) -> None:
    other = task.model_copy(update={"task_id": task.task_id + "-other", "seed": task.seed + 1})
    rollouts[:] = read_rollouts(finish(generate(other)).data)


ATTACKS = [
    ("tokens of another model, proven by the real one", other_model_tokens, "sampling"),
    ("random tokens, proven by the real model", random_tokens, "sampling"),
    ("tokens edited after the proof", edited_after_proof, "sampling"),
    ("inflated rewards", inflated_rewards, "rewards"),
    ("prompts other than the assigned ones", other_prompts, "assignment"),
    ("cut short without EOS", cut_short, "termination"),
    ("truncated proofs", truncated_proofs, "integrity"),
    ("malformed proofs", garbled_proofs, "toploc"),
    ("proofs computed on another model", proofs_from_another_model, "toploc"),
    ("a file replayed from another task", replayed_from_another_task, "assignment"),
]
