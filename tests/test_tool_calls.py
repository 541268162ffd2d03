"""A tool environment's calls in each family's own syntax: read off the chat template (Qwen3's Hermes tags, Llama 3's
JSON, a plain fallback for Gemma 3's template that knows no tools), parsed from the model's turn, and answered in the
template's own tool turn."""

from __future__ import annotations

from typing import Any

import pytest

from intellect_protocol.shared.environments.calculator import evaluate
from intellect_protocol.shared.environments.registry import Problem
from intellect_protocol.shared.environments.tool_calls import ToolCalling, episode_rules, tool_syntax
from intellect_protocol.shared.environments.turns import Tool, template_tools
from intellect_protocol.shared.models import encode_prompt
from intellect_protocol.shared.tiny_model import bpe_tokenizer
from tests.support.tool_templates import TEMPLATES

pytestmark = pytest.mark.unit

CALC = Tool(
    name="calc",
    description="Evaluates + and *.",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)
PROBLEM = Problem(id="m0", prompt="347*28:", answer="9716")


class Calc:
    """A tool environment: one ``calc`` tool, no ``reply`` or ``stops`` of its own."""

    name = "calc-tools"
    tools = [CALC]
    max_turns = 2
    max_reply_tokens = 64

    def problems(self) -> list[Problem]:
        return [PROBLEM]

    def call(self, problem: Problem, seed: int, name: str, arguments: dict[str, Any]) -> str:  # noqa: ARG002
        return evaluate(str(arguments.get("expression", "")))

    def task_reward(self, completion: str, problem: Problem) -> float:
        return float(completion.rstrip().endswith(problem.answer or "?"))


def tokenizer_for(family: str):  # noqa: ANN201
    tokenizer = bpe_tokenizer(300)
    tokenizer.chat_template = TEMPLATES[family]
    return tokenizer


@pytest.mark.parametrize(
    ("family", "call", "result"),
    [
        (
            "qwen3",
            '<tool_call>\n{"name": "calc", "arguments": {"expression": "347*28"}}\n</tool_call>',
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n9716\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "llama",
            '{"name": "calc", "parameters": {"expression": "347*28"}}',
            "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n9716<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "gemma3_text",
            'Let me compute. <tool_call>{"name": "calc", "arguments": {"expression": "347*28"}}</tool_call>',
            "\n<tool_response>\n9716\n</tool_response>\n",
        ),
    ],
    ids=["qwen3", "llama", "gemma3_text"],
)
def test_a_call_in_the_familys_syntax_is_answered_in_its_tool_turn(family: str, call: str, result: str) -> None:
    tokenizer = tokenizer_for(family)
    rules = episode_rules(Calc(), tokenizer, 128)
    assert rules is not None and any(call.endswith(stop) for stop in rules.stops)  # the call ends the model's turn
    assert ToolCalling(Calc(), Calc.tools, tool_syntax(tokenizer)).reply(PROBLEM, 0, ["347*28:", call]) == result


def test_the_tools_reach_the_prompt_through_the_template_or_as_text() -> None:
    tools = template_tools(Calc())
    assert tools == [CALC.as_template_tool()]
    qwen = tokenizer_for("qwen3")
    assert '"name": "calc"' in qwen.decode(encode_prompt(qwen, PROBLEM.prompt, tools=tools))
    gemma = tokenizer_for("gemma3_text")  # no tools in its template: one line before the problem
    assert "Tool calc: Evaluates + and *." in gemma.decode(encode_prompt(gemma, PROBLEM.prompt, tools=tools))


@pytest.mark.parametrize(
    ("turn", "answer"),
    [
        ("347*28 is hard</tool_call>", "error: not a tool call"),
        ('<tool_call>{"name": "calc", "arguments": {"expression": </tool_call>', "error: not a tool call"),
        ('<tool_call>{"name": "calc", "args": {}}</tool_call>', 'error: a call is {"name": ..., "arguments": {...}}'),
        ('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>', "error: no tool named 'shell'"),
        ('<tool_call>{"name": "calc", "arguments": {"expression": "2**99"}}</tool_call>', "error"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "error: not a tool call"),
        ("<tool_call>x" * 20_000 + "</tool_call>", "error: not a tool call"),
    ],
    ids=["prose", "broken-json", "wrong-keys", "undeclared-tool", "tool-refuses", "nested-past-the-parser", "many-tags"],
)
def test_a_turn_that_is_no_call_of_a_declared_tool_gets_a_one_line_error(turn: str, answer: str) -> None:
    tokenizer = tokenizer_for("qwen3")
    frame = tool_syntax(tokenizer).render
    assert ToolCalling(Calc(), Calc.tools, tool_syntax(tokenizer)).reply(PROBLEM, 0, [turn]) == frame(answer)
