"""A run's prompting: how each problem becomes the model's prompt beyond its text (rendered by
:func:`shared.models.encode_prompt`, alike in every role)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Prompting(BaseModel):
    """How a problem becomes the model's prompt, beyond its text (a run setting; every role renders alike)."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str | None = Field(None, max_length=16_384)
    """The system turn before each problem; without a chat template, the text before the problem and a blank line."""
    enable_thinking: bool | None = None
    """Passed to the chat template as ``enable_thinking`` (Qwen3-style templates open or close the thinking
    block by it); None: the template's own default. Ignored without a chat template."""
