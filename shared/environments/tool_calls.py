"""Tool calls in the model's own syntax: an environment declares tools and answers calls; the model's chat template
decides how a call is written and how its result is read.

A *tool environment* declares ``tools`` (:class:`~shared.environments.turns.Tool`), ``max_turns`` and
``max_reply_tokens``, and answers ``call(problem, seed, name, arguments)`` with the tool's result as text: a pure
function of its arguments, as a multi-turn environment's ``reply`` is. It writes no ``stops`` and no ``reply``:
:func:`tool_syntax` reads them off the tokenizer's chat template, and :class:`ToolCalling` is the multi-turn
environment that node and validator run, so both write the same tokens.

- Hermes syntax (the template mentions ``<tool_call>``, as Qwen2.5's and Qwen3's do): a call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and the closing tag ends the model's turn.
- Llama 3's JSON (the template has an ``ipython`` role): a call is ``{"name": ..., "parameters": {...}}``, and
  ``}}`` ends the model's turn (a call's arguments are one flat object).
- Anything else (Gemma 3, whose template has no tools, or no template at all): the tools are written before the
  problem (:func:`shared.models.encode_prompt`) and calls take the Hermes syntax.

A result is written as the template writes a ``tool`` message after the assistant's call, up to where the assistant's
next turn begins: the template's own text around a placeholder, rendered once per template. Where the template
renders no tool message, it follows the call as ``<tool_response>...</tool_response>``. A turn that is no well-formed
call of a declared tool gets a one-line error as its result, so the model can learn from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from intellect_protocol.shared.environments.bounded import task_rewards
from intellect_protocol.shared.environments.registry import Problem
from intellect_protocol.shared.environments.turns import Rules, Tool, rules_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_CALL, _RESULT = "CALL-1b7e", "RESULT-1b7e"
"""Placeholders the template renders around, to find its text between a call and the next assistant turn."""
PLAIN_FRAME = f"\n<tool_response>\n{_RESULT}\n</tool_response>\n"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@runtime_checkable
class ToolEnvironment(Protocol):
    name: str
    tools: list[Tool]
    max_turns: int
    max_reply_tokens: int

    def problems(self) -> list[Problem]: ...

    def call(self, problem: Problem, seed: int, name: str, arguments: dict[str, Any]) -> str: ...

    def task_reward(self, completion: str, problem: Problem) -> float: ...


def is_tool_environment(environment: object) -> bool:
    return isinstance(environment, ToolEnvironment) and not hasattr(environment, "reply")


@dataclass(frozen=True)
class ToolSyntax:
    """How one chat template writes a call and its result."""

    name: str
    """``hermes``, ``llama-json`` or ``plain``."""
    stops: tuple[str, ...]
    frame: str
    """A result's text, with :data:`_RESULT` where the result goes."""

    def parse(self, turn: str) -> tuple[str, dict[str, Any]] | str:
        """The call that ends ``turn`` (tool name, arguments), or why it is none."""
        if self.name == "llama-json":
            start = turn.find("{")
            text, key = (turn[start:] if start >= 0 else ""), "parameters"
        else:  # the turn ended at the closing tag: its call opens at the last opening tag (found in linear time)
            start, end = turn.rfind(_OPEN), len(turn) - len(_CLOSE)
            text, key = (turn[start + len(_OPEN) : end] if start >= 0 and turn.endswith(_CLOSE) else ""), "arguments"
        try:
            call = json.loads(text)
        except (json.JSONDecodeError, RecursionError):  # the turn is the node's: nested deeper than the parser goes
            return "error: not a tool call"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(call.get(key), dict):
            return f'error: a call is {{"name": ..., "{key}": {{...}}}}'
        return call["name"], call[key]

    def render(self, result: str) -> str:
        return self.frame.replace(_RESULT, result)


def tool_syntax(tokenizer: PreTrainedTokenizerBase) -> ToolSyntax:
    """The call syntax of ``tokenizer``'s chat template (see the module's docstring)."""
    return (
        _syntax(tokenizer.chat_template)
        if isinstance(tokenizer.chat_template, str)
        else ToolSyntax("plain", (_CLOSE,), PLAIN_FRAME)
    )


@lru_cache(maxsize=16)
def _syntax(template: str) -> ToolSyntax:
    from transformers.utils.chat_template_utils import render_jinja_template

    frame = PLAIN_FRAME
    if "tools" in template:
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": _CALL},
            {"role": "tool", "content": _RESULT},
        ]
        try:
            rendered = render_jinja_template([messages], chat_template=template, add_generation_prompt=True)[0][0]
        except Exception:  # noqa: BLE001  # a template that takes no tool message (it raises) gets the plain frame
            rendered = ""
        after = rendered.split(_CALL, 1)[-1] if _CALL in rendered else ""
        if after.count(_RESULT) == 1:
            frame = after
    if "ipython" in template:
        return ToolSyntax("llama-json", ("}}",), frame)
    return ToolSyntax("hermes" if _OPEN in template else "plain", (_CLOSE,), frame)


class ToolCalling:
    """A tool environment as the multi-turn environment one model's episodes run: the model's turn is parsed as a
    call in its syntax, the environment answers, and the answer is written as the template writes a tool's result."""

    def __init__(self, answers: Any, tools: list[Tool], syntax: ToolSyntax) -> None:
        """``answers``: what answers calls and scores episodes (the environment, or its bounded process)."""
        self.answers, self.syntax, self.tools = answers, syntax, {t.name for t in tools}
        self.name = getattr(answers, "name", "?")
        self.requirement = getattr(answers, "requirement", None)

    def reply(self, problem: Problem, seed: int, turns: list[str]) -> str:
        parsed = self.syntax.parse(turns[-1])
        if isinstance(parsed, str):
            return self.syntax.render(parsed)
        name, arguments = parsed
        if name not in self.tools:
            return self.syntax.render(f"error: no tool named {name[:64]!r}")
        return self.syntax.render(self.answers.call(problem, seed, name, arguments))

    def task_reward(self, completion: str, problem: Problem) -> float:
        return float(self.answers.task_reward(completion, problem))

    def task_rewards(self, scored: list[tuple[str, Problem]]) -> list[float]:
        return task_rewards(self.answers, scored)


def episode_rules(environment: object, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> Rules | None:
    """The episode rules of a task of ``max_tokens`` in ``environment`` for a model of ``tokenizer``; None for a
    single-turn environment."""
    if is_tool_environment(environment):
        tools = cast(ToolEnvironment, environment)
        return Rules(tool_syntax(tokenizer).stops, tools.max_turns, tools.max_reply_tokens, max_tokens)
    return rules_of(environment, max_tokens)


def episode_replies(answers: Any, environment: object, tokenizer: PreTrainedTokenizerBase) -> Any:
    """What answers ``environment``'s episodes for a model of ``tokenizer``: ``answers`` (the environment, or its
    bounded process) itself, or for a tool environment, ``answers`` in the model's tool syntax."""
    if is_tool_environment(environment):
        return ToolCalling(answers, cast(ToolEnvironment, environment).tools, tool_syntax(tokenizer))
    return answers
