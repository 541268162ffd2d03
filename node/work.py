"""One task, start to finish on the node: prompts -> completions -> rewards -> proofs -> file."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache

from node.inference.torch_backend import TorchBackend
from shared.environments.length import LengthBudget, with_target
from shared.environments.registry import Environment, get_environment, reward
from shared.models import encode_prompt, load_model
from shared.rollout_file import Rollout, write_rollouts
from shared.schemas import TaskSpec, sequence_seed
from shared.toploc import build_proofs_batch


@dataclass
class TaskResult:
    data: bytes
    rollouts: int
    tokens: int
    mean_reward: float
    generate_s: float


@cache
def backend_for(model: str) -> tuple[TorchBackend, object]:
    loaded, tokenizer = load_model(model)
    return TorchBackend(loaded, tokenizer.eos_token_id, tokenizer.pad_token_id), tokenizer


@cache
def environment_for(name: str) -> Environment:
    return get_environment(name)


def run_task(task: TaskSpec) -> TaskResult:
    backend, tokenizer = backend_for(task.model)
    environment = environment_for(task.environment)
    problems = {p.id: p for p in environment.problems()}
    budget = LengthBudget(alpha=task.length_alpha, target_tokens=task.target_length, over_only=task.length_over_only)

    rows = [(problems[pid], i) for i, pid in enumerate(pid for pid in task.prompt_ids for _ in range(task.samples_per_prompt))]
    prompt_text = {
        pid: with_target(problems[pid].prompt, budget) if budget.alpha else problems[pid].prompt for pid in task.prompt_ids
    }
    prompts = [encode_prompt(tokenizer, prompt_text[problem.id]) for problem, _ in rows]
    seeds = [sequence_seed(task.seed, i) for _, i in rows]

    start = time.perf_counter()
    completions = backend.generate(prompts, seeds, task.sampling)
    generate_s = time.perf_counter() - start
    proofs = build_proofs_batch([c.hidden for c in completions])

    rollouts = []
    for (problem, _), prompt, seed, completion, proof in zip(rows, prompts, seeds, completions, proofs, strict=True):
        text = tokenizer.decode(completion.tokens, skip_special_tokens=True)
        task_reward = environment.task_reward(text, problem)
        final, penalty = reward(task_reward, len(completion.tokens), budget)
        rollouts.append(
            Rollout(
                task_id=task.task_id,
                run_id=task.run_id,
                policy_step=task.policy_step,
                prompt_id=problem.id,
                prompt_tokens=prompt,
                completion_tokens=completion.tokens,
                logprobs=completion.logprobs,
                finish_reason=completion.finish_reason,
                reward=final,
                task_reward=task_reward,
                length_penalty=penalty,
                target_length=task.target_length if budget.alpha else 0,
                seed=seed,
                proofs=proof,
            )
        )
    return TaskResult(
        data=write_rollouts(rollouts),
        rollouts=len(rollouts),
        tokens=sum(len(r.completion_tokens) for r in rollouts),
        mean_reward=sum(r.reward for r in rollouts) / len(rollouts),
        generate_s=generate_s,
    )
