"""Loading causal language models (Hugging Face format) and reaching their last hidden states."""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, cast

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.prompting import Prompting
from intellect_protocol.shared.schemas import DEFAULT_MODEL

TINY_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "tiny-arith"
"""The embedded default: a tiny Llama trained by ``python -m intellect_protocol.shared.tiny_model`` and shipped."""
SHIPPED_MODELS = {
    DEFAULT_MODEL: TINY_MODEL_DIR,
    "tiny-calc": TINY_MODEL_DIR.parent / "tiny-calc",
    "tiny-reason": TINY_MODEL_DIR.parent / "tiny-reason",
}
"""Models that ship with the package, by name: ``tiny-calc`` calls the calculator environment's tool
(``python -m intellect_protocol.shared.tiny_calc``), ``tiny-reason`` thinks at length on long sums
(``python -m intellect_protocol.shared.tiny_reason``)."""


@spent("model loading")
def load_model(
    name_or_path: str | Path = TINY_MODEL_DIR, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model and its tokenizer from a local directory, or from the hub by id (real runs).

    ``tiny-arith`` (:data:`shared.schemas.DEFAULT_MODEL`) names the shipped tiny model.
    """
    name_or_path = resolve_model(name_or_path)
    local = Path(name_or_path).is_dir()
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, local_files_only=local)
    model = model.to(device).eval()  # type: ignore[arg-type]  # transformers wraps `to` in a decorator mypy misreads
    return model, load_tokenizer(name_or_path)


def resolve_model(name_or_path: str | Path) -> str:
    """A local directory or hub id for ``name_or_path``, a shipped model (:data:`SHIPPED_MODELS`) by its name."""
    return str(SHIPPED_MODELS.get(str(name_or_path), name_or_path))


class TokenizerMissing(ValueError):
    """A model directory without tokenizer files: transformers would build an empty tokenizer from its config
    alone, and every prompt would encode to nothing."""


TOKENIZER_FILES = (
    "the model directory lacks its tokenizer files (tokenizer.json, or vocab.json and merges.txt, or tokenizer.model, "
    "beside tokenizer_config.json); copy them from the model the weights came from."
)
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model", "vocab.txt", "tekken.json")
"""Files one of which holds a tokenizer's vocabulary, in the formats transformers loads."""


@cache
def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    """The model's tokenizer; :class:`TokenizerMissing` for a local directory without one."""
    resolved = resolve_model(name_or_path)
    local = Path(resolved).is_dir()
    if local and not any((Path(resolved) / name).is_file() for name in VOCABULARY_FILES):
        raise TokenizerMissing(f"The tokenizer of {resolved} is missing: {TOKENIZER_FILES}")
    return AutoTokenizer.from_pretrained(resolved, local_files_only=local)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward takes a KV cache by: ``cache`` in the transformers releases that
    renamed it (where ``past_key_values`` warns, and goes in 5.40), ``past_key_values`` before them.
    Read from the forward's own signature, so the installed release decides."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose output feeds the LM head (``model.model.norm`` in Llama/Qwen families)."""
    base = getattr(model, "base_model", model)
    norm = getattr(base, "norm", None)
    if norm is None:
        raise ValueError(f"{type(model).__name__} has no final norm where Llama-family models keep it")
    return cast(torch.nn.Module, norm)


@contextmanager
def final_norm_outputs(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect the final norm's output of every forward pass this thread runs inside the block.

    A hook sees every thread's passes through a shared model; each keeps only its own, so two
    validators (or a node and a validator) sharing one loaded model never swap hidden states."""
    captured: list[torch.Tensor] = []
    mine = threading.get_ident()

    def keep(_module: torch.nn.Module, _input: object, output: torch.Tensor) -> None:
        if threading.get_ident() == mine:
            captured.append(output.detach())

    handle = final_norm(model).register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, text: str, prompting: Prompting | None = None, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """How every role turns a prompt into token ids. With a chat template (an instruction-tuned
    model), the run's system turn (if any) and the user's turn as the template renders them, up to
    where the assistant's answer begins, with the run's thinking switch; without one, BOS (when the
    model has one), then the system prompt and a blank line (if any), then the text.

    ``tools`` (a multi-turn environment's, as chat templates take them: ``{"type": "function", "function": ...}``)
    go through the template where it renders tools; otherwise they are written before the text, one line each."""
    prompting = prompting or Prompting()
    if tools and not (tokenizer.chat_template and "tools" in tokenizer.chat_template):
        text = f"{tools_text(tools)}\n\n{text}"
        tools = None
    if tokenizer.chat_template:
        system = [{"role": "system", "content": prompting.system_prompt}] if prompting.system_prompt is not None else []
        switch: dict[str, Any] = {"enable_thinking": prompting.enable_thinking} if prompting.enable_thinking is not None else {}
        rendered_tools: list[dict[Any, Any] | Callable[..., Any]] | None = list(tools) if tools else None
        rendered = tokenizer.apply_chat_template(
            [*system, {"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=False,
            tools=rendered_tools,
            **switch,
        )
        ids: list[int] = tokenizer.encode(rendered, add_special_tokens=False)  # the template writes its own special tokens
        return ids
    if prompting.system_prompt is not None:
        text = f"{prompting.system_prompt}\n\n{text}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    bos = tokenizer.bos_token_id
    return [bos, *ids] if bos is not None else ids


def tools_text(tools: list[dict[str, Any]]) -> str:
    """Tools written as plain text, for a model whose chat template renders none: one line each."""
    lines = []
    for tool in tools:
        function = tool["function"]
        arguments = json.dumps(function["parameters"], sort_keys=True)
        lines.append(f"Tool {function['name']}: {function['description']} Arguments: {arguments}")
    return "\n".join(lines)
