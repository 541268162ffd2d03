"""What a task assigns, row by row: the one derivation nodes generate from and validators check
against. Rows are prompt-major: each of the task's prompts ``samples_per_prompt`` times, row
i sampled with :func:`shared.schemas.sequence_seed` (task seed, i)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from intellect_protocol.shared.environments.length import LengthBudget, with_target
from intellect_protocol.shared.environments.registry import Problem, get_environment
from intellect_protocol.shared.environments.turns import template_tools
from intellect_protocol.shared.models import encode_prompt
from intellect_protocol.shared.schemas import TaskSpec, sequence_seed


@dataclass(frozen=True)
class AssignedRow:
    problem: Problem
    prompt_tokens: list[int]
    seed: int


def budget_of(task: TaskSpec) -> LengthBudget:
    return LengthBudget(alpha=task.length_alpha, target_tokens=task.target_length, over_only=task.length_over_only)


def assigned_rows(task: TaskSpec, problems: dict[str, Problem], tokenizer: PreTrainedTokenizerBase) -> list[AssignedRow]:
    """The task's rows; ``KeyError`` when it names a problem the environment lacks."""
    budget = budget_of(task)
    environment = get_environment(task.environment, task.environment_version)
    tools = template_tools(environment)
    prompts = {
        pid: encode_prompt(tokenizer, with_target(problems[pid].prompt, budget, environment), task.prompting, tools)
        for pid in task.prompt_ids
    }
    ids = [pid for pid in task.prompt_ids for _ in range(task.samples_per_prompt)]
    return [AssignedRow(problems[pid], prompts[pid], sequence_seed(task.seed, i)) for i, pid in enumerate(ids)]
