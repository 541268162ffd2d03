"""The thinking budget, as INTELLECT-2: a target length in the prompt, a penalty for missing it.

reward = task_reward - alpha * |target - length|        (or only (length - target)+ when over_only)
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field


class LengthBudget(BaseModel):
    """A run's thinking-budget settings."""

    alpha: float = Field(0.0, ge=0)
    """Penalty per token away from the target; 0 turns the budget off."""
    target_tokens: int = Field(1024, ge=1)
    """The length asked for in the prompt."""
    over_only: bool = False
    """Penalise only completions longer than the target."""


def length_penalty(length: int, budget: LengthBudget) -> float:
    gap = length - budget.target_tokens
    return budget.alpha * (max(gap, 0) if budget.over_only else abs(gap))


def model_length(tokens: Sequence[int], sampled: Sequence[bool] | None) -> int:
    """The length a budget judges: the tokens the model sampled (all of a single-turn completion's). An
    environment's replies are not the model's thinking: a tool that answers at length costs the model nothing."""
    return len(tokens) if sampled is None else sum(sampled)


def with_target(prompt: str, budget: LengthBudget) -> str:
    """The prompt with its budget stated, for text environments (the arithmetic one has no room for it)."""
    return f"{prompt}\n\nThink for about {budget.target_tokens} tokens before giving your final answer."
