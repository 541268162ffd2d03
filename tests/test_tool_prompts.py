"""A multi-turn environment's tools reach the model's prompt: through its chat template where the template renders
tools (as Qwen3's and Llama 3's do), as plain text before the problem where it does not or where there is none."""

from __future__ import annotations

import pytest

from intellect_protocol.shared.environments.turns import Tool
from intellect_protocol.shared.models import encode_prompt
from intellect_protocol.shared.tiny_model import bpe_tokenizer

pytestmark = pytest.mark.unit

CALC = Tool(
    name="calc", description="Evaluates + and *.", parameters={"type": "object", "properties": {"expr": {"type": "string"}}}
)
# The shape of Qwen3's template: the tools' JSON in a system turn of their own, then the conversation.
WITH_TOOLS = (
    "{{ bos_token }}{% if tools %}{{ '<|system|>' }}{% for t in tools %}{{ t['function']['name'] + ':' + t['function']['description'] }}"
    "{% endfor %}{% endif %}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def text_of(tokenizer, ids: list[int]) -> str:  # noqa: ANN001
    return tokenizer.decode(ids, skip_special_tokens=False)


def test_a_template_that_renders_tools_renders_them() -> None:
    tokenizer = bpe_tokenizer(300)
    tokenizer.chat_template = WITH_TOOLS
    text = text_of(tokenizer, encode_prompt(tokenizer, "347*28:", tools=[CALC.as_template_tool()]))
    assert text == "<bos><|system|>calc:Evaluates + and *.<|user|>347*28:<|assistant|>"
    # No tools: the same template renders the plain conversation.
    assert text_of(tokenizer, encode_prompt(tokenizer, "347*28:")) == "<bos><|user|>347*28:<|assistant|>"


def test_tools_are_written_out_where_the_template_renders_none_or_there_is_no_template() -> None:
    tokenizer = bpe_tokenizer(300)  # its template knows no tools
    line = 'Tool calc: Evaluates + and *. Arguments: {"properties": {"expr": {"type": "string"}}, "type": "object"}'
    rendered = text_of(tokenizer, encode_prompt(tokenizer, "347*28:", tools=[CALC.as_template_tool()]))
    assert rendered == f"<bos><|user|>{line}\n\n347*28:<|assistant|>"
    tokenizer.chat_template = None
    assert text_of(tokenizer, encode_prompt(tokenizer, "347*28:", tools=[CALC.as_template_tool()])) == f"<bos>{line}\n\n347*28:"
