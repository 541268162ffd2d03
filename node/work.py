"""One task on the node, in two halves so they can overlap across tasks:
:func:`generate` (prompts -> completions, the model's work) and :func:`finish`
(rewards, proofs, the rollout file: CPU work the finisher process, :mod:`node.finishers`, does while the next task generates)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache, lru_cache

from transformers import PreTrainedTokenizerBase

from intellect_protocol.node.settings import BackendKind, Dtype
from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.environments.bounded import BoundedRewards, task_rewards
from intellect_protocol.shared.environments.length import LengthBudget, model_length
from intellect_protocol.shared.environments.registry import (
    Problem,
    completion_text,
    get_environment,
    reward,
)
from intellect_protocol.shared.environments.tool_calls import episode_replies, episode_rules
from intellect_protocol.shared.episodes import run_episodes
from intellect_protocol.shared.inference import Completion, InferenceBackend
from intellect_protocol.shared.models import load_model, load_tokenizer, resolve_model
from intellect_protocol.shared.numerics import Numerics, torch_dtype
from intellect_protocol.shared.rollout_file import Rollout, write_rollouts
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.shared.tasks import AssignedRow, assigned_rows, budget_of
from intellect_protocol.shared.toploc import build_proofs_batch
from intellect_protocol.shared.torch_backend import TorchBackend


@dataclass
class TaskResult:
    data: bytes
    rollouts: int
    tokens: int
    mean_reward: float
    generate_s: float


def backend_for(
    model: str, kind: BackendKind = "torch", dtype: Dtype = "float32"
) -> tuple[InferenceBackend, PreTrainedTokenizerBase]:
    """A backend generating with ``model`` (loading is the expensive part) and its tokenizer."""
    if kind == "vllm":
        from intellect_protocol.shared.vllm_backend import engine_for

        tokenizer = load_tokenizer(model)
        return engine_for(resolve_model(model), tokenizer.eos_token_id, dtype), tokenizer
    return torch_backend_for(model, dtype)


@lru_cache(maxsize=2)  # the current policy step and the one before, while tasks of both finish
def torch_backend_for(model: str, dtype: Dtype) -> tuple[TorchBackend, PreTrainedTokenizerBase]:
    loaded, tokenizer = load_model(model, dtype=torch_dtype(dtype))
    return TorchBackend(loaded, tokenizer.eos_token_id, tokenizer.pad_token_id), tokenizer


@cache
def rewards_for(name: str, version: str) -> BoundedRewards:
    """The run's reward, computed in a bounded process of its own (one per environment, for the process's life)."""
    return BoundedRewards(name, version)


@cache
def problems_for(name: str, version: str) -> dict[str, Problem]:
    return {p.id: p for p in get_environment(name, version).problems()}


@dataclass
class Generated:
    task: TaskSpec
    rows: list[AssignedRow]
    completions: list[Completion]
    budget: LengthBudget
    generate_s: float
    numerics: Numerics
    sampled: list[list[bool]] | None = None
    """Per row, which completion tokens the model sampled (a multi-turn episode's); None: every one."""


def run_task(task: TaskSpec, backend: BackendKind = "torch") -> TaskResult:
    return finish(generate(task, backend))


def generate(task: TaskSpec, backend_kind: BackendKind = "torch", dtype: Dtype = "float32") -> Generated:
    backend, tokenizer = backend_for(task.model, backend_kind, dtype)
    return generate_with(backend, tokenizer, task)


def generate_with(backend: InferenceBackend, tokenizer: PreTrainedTokenizerBase, task: TaskSpec) -> Generated:
    """``task``'s completions from ``backend`` (whatever weights it holds, whatever ``task.model`` says)."""
    rows = assigned_rows(task, problems_for(task.environment, task.environment_version), tokenizer)
    environment = get_environment(task.environment, task.environment_version)
    rules = episode_rules(environment, tokenizer, task.sampling.max_tokens)
    start = time.perf_counter()
    sampled = None
    with spent("generation"):
        if rules is None:
            completions = backend.generate([r.prompt_tokens for r in rows], [r.seed for r in rows], task.sampling)
        else:
            replies = episode_replies(rewards_for(task.environment, task.environment_version), environment, tokenizer)
            episodes = run_episodes(
                backend,
                tokenizer,
                replies,
                [(r.prompt_tokens, r.seed, r.problem) for r in rows],
                task.sampling,
                rules,
            )
            completions, sampled = [c for c, _ in episodes], [s for _, s in episodes]
    return Generated(task, rows, completions, budget_of(task), time.perf_counter() - start, backend.numerics, sampled)


def finish(generated: Generated) -> TaskResult:
    rollouts = score(generated, build_proofs_batch([c.hidden for c in generated.completions]))
    return TaskResult(
        data=write_rollouts(rollouts, generated.numerics),
        rollouts=len(rollouts),
        tokens=sum(len(r.completion_tokens) for r in rollouts),
        mean_reward=sum(r.reward for r in rollouts) / len(rollouts),
        generate_s=generated.generate_s,
    )


@spent("scoring")
def score(generated: Generated, proofs: list[bytes]) -> list[Rollout]:
    """The task's rollouts: each completion with its environment reward, length penalty and proof."""
    task, budget = generated.task, generated.budget
    tokenizer = load_tokenizer(task.model)
    texts = [(completion_text(tokenizer, c.tokens), row.problem) for row, c in zip(generated.rows, generated.completions)]
    # PluginFailure: the task goes back, said so.
    rewards = task_rewards(rewards_for(task.environment, task.environment_version), texts)
    rollouts = []
    flags: list[list[bool] | None] = [None] * len(generated.rows) if generated.sampled is None else list(generated.sampled)
    for row, completion, proof, sampled, task_reward in zip(
        generated.rows, generated.completions, proofs, flags, rewards, strict=True
    ):
        final, penalty = reward(task_reward, model_length(completion.tokens, sampled), budget)
        rollouts.append(
            Rollout(
                task_id=task.task_id,
                run_id=task.run_id,
                policy_step=task.policy_step,
                prompt_id=row.problem.id,
                prompt_tokens=row.prompt_tokens,
                completion_tokens=completion.tokens,
                logprobs=completion.logprobs,
                finish_reason=completion.finish_reason,
                reward=final,
                task_reward=task_reward,
                length_penalty=penalty,
                target_length=task.target_length if budget.alpha else 0,
                seed=row.seed,
                proofs=proof,
                sampled=sampled,
            )
        )
    return rollouts
