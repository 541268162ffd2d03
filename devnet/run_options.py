"""What the devnet's run is created with: its shape, and what the environment asks for itself (its model, its
completion limit), with an optional thinking budget."""

from __future__ import annotations

from pathlib import Path

MAX_TOKENS = 64
"""A task's completion limit, where the environment sets none of its own (``max_tokens``)."""
RUN = ["--prompts-per-task", "4", "--samples-per-prompt", "8"]
BUDGET_ALPHA = 0.002
"""The devnet's thinking-budget penalty a token: long-sum's two scratchpads, about 180 tokens apart, differ by 0.36."""


def environment_defaults(environment: str) -> tuple[Path | None, int]:
    """The shipped model an environment names for itself (``tiny-calc`` for the calculator) if any, and its tasks'
    completion limit (its ``max_tokens``, else :data:`MAX_TOKENS`)."""
    from intellect_protocol.shared.environments.registry import EnvironmentUnavailable, get_environment
    from intellect_protocol.shared.models import resolve_model

    try:
        found = get_environment(environment)
    except EnvironmentUnavailable:
        return None, MAX_TOKENS  # creating the run says so, plainly
    named, max_tokens = getattr(found, "model", None), getattr(found, "max_tokens", MAX_TOKENS)
    return (Path(resolve_model(named)) if isinstance(named, str) else None), int(max_tokens)
