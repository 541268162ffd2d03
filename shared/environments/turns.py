"""The environment protocol's second form: episodes of several turns, where the environment answers the model.

A multi-turn environment is an :class:`~shared.environments.registry.Environment` that also declares:

- ``tools``: what the model may call (name, description, JSON schema of the arguments), rendered into the prompt
  through the model's chat template where the template takes tools, as plain text before the problem otherwise
  (:func:`shared.models.encode_prompt`); a model trained on the call syntax needs none (``[]``).
- ``stops``: the texts that end a model turn and hand the word to the environment (a tool call's closing text).
- ``max_turns`` and ``max_reply_tokens``: bounds on what the environment writes into one episode.
- ``reply(problem, seed, turns)``: given the model's turns so far (their text, in order; the last one ended with a
  stop), the environment's answer (a tool's result, a user's reply), or None when the episode is over.

``reply`` must be a pure function of its arguments: no clock, no network, no randomness but what ``seed`` (the
row's own seed) draws, and any budget counted in units that do not depend on the machine (steps, bytes), so a
validator that replays the episode on another machine gets the same text, and so the same tokens.
``task_reward`` then scores the whole episode's text (the model's turns and the environment's, in order).
Single-turn environments are unchanged: an environment without ``reply`` is one.

Optionally, ``call_correct(problem, reply)`` says whether a reply answered a correct call (the operator's held-out
evaluation charts the share of episodes with one, beside accuracy).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from intellect_protocol.shared.environments.registry import Problem, completion_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Tool(BaseModel):
    """A tool the model may call, as chat templates take them."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    description: str = Field(max_length=1024)
    parameters: dict[str, Any]
    """The arguments' JSON schema."""

    def as_template_tool(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@runtime_checkable
class MultiTurnEnvironment(Protocol):
    name: str
    tools: list[Tool]
    stops: tuple[str, ...]
    max_turns: int
    max_reply_tokens: int

    def problems(self) -> list[Problem]: ...

    def reply(self, problem: Problem, seed: int, turns: list[str]) -> str | None: ...

    def task_reward(self, completion: str, problem: Problem) -> float: ...


def is_multi_turn(environment: object) -> bool:
    return isinstance(environment, MultiTurnEnvironment)


def turn_ended(tokenizer: PreTrainedTokenizerBase, tokens: list[int], stops: tuple[str, ...]) -> bool:
    """Whether a model turn of ``tokens`` ends at its last token. The turn is decoded whole only when that token
    could complete a stop (its own text holds a stop's last character, or is part of a character split across
    tokens), so checking after every token costs one short decode, not a growing one."""
    if not _may_end(tokenizer, stops, tokens[-1]):
        return False
    text = completion_text(tokenizer, tokens)
    return any(text.endswith(stop) for stop in stops)


@lru_cache(maxsize=1 << 16)
def _may_end(tokenizer: PreTrainedTokenizerBase, stops: tuple[str, ...], token: int) -> bool:
    """Whether ``token`` could complete one of ``stops``, by its own text: asked at every position of every turn, by
    the node as it generates and the validator as it replays, so each token's answer is kept."""
    last = completion_text(tokenizer, [token])
    return "\ufffd" in last or any(stop[-1] in last for stop in stops)


@dataclass(frozen=True)
class Rules:
    """What bounds an episode: the environment's declarations and the task's token limit."""

    stops: tuple[str, ...]
    max_turns: int
    max_reply_tokens: int
    max_tokens: int

    @property
    def environment_tokens(self) -> int:
        """The most tokens the environment can write into one completion (the model writes its first)."""
        return min(self.max_tokens - 1, self.max_turns * self.max_reply_tokens)


def rules_of(environment: object, max_tokens: int) -> Rules | None:
    """The episode rules of a task of ``max_tokens`` in ``environment``; None for a single-turn environment."""
    if not isinstance(environment, MultiTurnEnvironment):
        return None
    return Rules(tuple(environment.stops), environment.max_turns, environment.max_reply_tokens, max_tokens)


def template_tools(environment: object) -> list[dict[str, Any]] | None:
    """``environment``'s tools as chat templates take them; None for none (a single-turn environment has none)."""
    answers = is_multi_turn(environment) or callable(getattr(environment, "call", None))  # a tool environment too
    tools = getattr(environment, "tools", None) if answers else None
    return [t.as_template_tool() for t in tools] if tools else None
