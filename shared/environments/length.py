"""The thinking budget, as INTELLECT-2: a target length in the prompt, a penalty for missing it.

reward = task_reward - alpha * |target - length|        (or only (length - target)+ when over_only)
"""

from __future__ import annotations

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


def with_target(prompt: str, budget: LengthBudget) -> str:
    """The prompt with its budget stated, for text environments (the arithmetic one has no room for it)."""
    return f"{prompt}\n\nThink for about {budget.target_tokens} tokens before giving your final answer."
