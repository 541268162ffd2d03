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


WITHIN = 0.25
"""How far from its target a length still counts as within budget, as a share of the target."""


def within_budget(length: int, budget: LengthBudget) -> bool:
    """Whether ``length`` meets the budget: within :data:`WITHIN` of the target, or below it when only overshoot is
    penalised. What the page and the benches count; the reward itself is :func:`length_penalty`'s."""
    gap = length - budget.target_tokens
    return (gap if budget.over_only else abs(gap)) <= WITHIN * budget.target_tokens


def with_target(prompt: str, budget: LengthBudget, environment: object) -> str:
    """The prompt with its budget stated (as it is, when the budget is off): by the environment's own
    ``budget_prompt(prompt, target_tokens)`` where it has one (for a model whose vocabulary cannot spell
    English), else in words."""
    if not budget.alpha:
        return prompt
    own = getattr(environment, "budget_prompt", None)
    if own is not None:
        stated: str = own(prompt, budget.target_tokens)
        return stated
    return f"{prompt}\n\nThink for about {budget.target_tokens} tokens before giving your final answer."
