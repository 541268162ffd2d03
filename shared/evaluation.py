"""Held-out evaluation of a policy step on the run's own environment: greedy completions of its held-out problems
(:mod:`shared.environments.held_out`), rendered as nodes render prompts, scored by its own reward.

The figure is the mean task reward over those problems (for a 0/1 reward such as arithmetic's, the share solved:
held-out accuracy). It is the operator's measurement (the devnet's, ``bench/``), posted to the coordinator as an
evaluation and charted on the page.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteria, StoppingCriteriaList

from intellect_protocol.shared.environments.bounded import BoundedRewards
from intellect_protocol.shared.environments.held_out import held_out
from intellect_protocol.shared.environments.length import LengthBudget, model_length, with_target, within_budget
from intellect_protocol.shared.environments.registry import Problem, completion_text, get_environment
from intellect_protocol.shared.environments.tool_calls import episode_replies, episode_rules
from intellect_protocol.shared.environments.turns import template_tools
from intellect_protocol.shared.episodes import run_episodes
from intellect_protocol.shared.models import encode_prompt
from intellect_protocol.shared.prompting import Prompting
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.torch_backend import TorchBackend


class Stopped(Exception):
    """An evaluation given up because its ``stop`` event was set."""


class _UntilSet(StoppingCriteria):
    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def __call__(self, input_ids: torch.Tensor, _scores: torch.Tensor, **_: object) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.stop.is_set(), dtype=torch.bool)


def greedy_decode(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    heads: list[list[int]],
    max_new_tokens: int,
    stop: threading.Event | None = None,
) -> list[str]:
    """Each prompt's greedy completion as text (:func:`greedy_tokens`)."""
    return tokenizer.batch_decode(greedy_tokens(model, tokenizer, heads, max_new_tokens, stop), skip_special_tokens=True)


@torch.inference_mode()
def greedy_tokens(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    heads: list[list[int]],
    max_new_tokens: int,
    stop: threading.Event | None = None,
) -> list[list[int]]:
    """Each prompt's (token ids') greedy completion, up to its EOS and with it, generated as one batch with a KV
    cache: ten times faster than re-reading the prefix at every token. Prompts of unequal length are padded on the
    left, where a causal model never reads them. Raises :class:`Stopped` when ``stop`` is set meanwhile: a caller
    that is shutting down waits at most one decoding step."""
    width = max(map(len, heads))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(heads), width), pad)  # [prompts, width]
    mask = torch.zeros_like(ids)
    for row, head in enumerate(heads):
        ids[row, width - len(head) :] = torch.tensor(head)
        mask[row, width - len(head) :] = 1
    out = model.generate(  # type: ignore[operator]  # transformers' GenerationMixin, untyped for mypy
        ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
        stopping_criteria=StoppingCriteriaList([_UntilSet(stop)]) if stop is not None else None,
    )
    if stop is not None and stop.is_set():
        raise Stopped
    completions = []
    for row in out[:, width:].tolist():
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        completions.append(row[:end])
    return completions


@dataclass(frozen=True)
class HeldOutTask:
    """What a run's held-out score is measured on: its environment's held-out problems, its prompting and length."""

    environment: str
    pin: str
    problems: list[Problem]
    source: str
    """Where the problems come from, in words (:attr:`~shared.environments.held_out.HeldOut.source`)."""
    prompting: Prompting | None
    max_new_tokens: int
    budget: LengthBudget = field(default_factory=LengthBudget)
    """The run's thinking budget, stated in every prompt as nodes state it (when it is on)."""

    @classmethod
    def of_run(
        cls, environment: str, pin: str, prompting: Prompting | None, max_new_tokens: int, budget: LengthBudget | None = None
    ) -> HeldOutTask:
        found = held_out(get_environment(environment, pin))
        return cls(environment, pin, found.problems, found.source, prompting, max_new_tokens, budget or LengthBudget())

    def describe(self) -> str:
        return f"{self.environment}: {self.source}"


def held_out_metrics(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: HeldOutTask,
    stop: threading.Event | None = None,
    batch: int = 64,
) -> dict[str, float]:
    """``heldout_accuracy``: the mean task reward of ``model``'s greedy completions of ``task``'s problems; for a
    multi-turn environment (greedy episodes, the environment answering) also ``heldout_tool_calls``: the share of
    episodes with a correct call, where the environment says which calls are (``call_correct``); under a thinking
    budget also ``heldout_within_budget``: the share of completions whose model tokens meet it (:func:`within_budget`)."""
    environment = get_environment(task.environment, task.pin)
    rules = episode_rules(environment, tokenizer, task.max_new_tokens)
    tools = template_tools(environment)
    rewards = BoundedRewards(task.environment, task.pin)
    try:
        total, called, within = 0.0, 0, 0
        for start in range(0, len(task.problems), batch):
            if stop is not None and stop.is_set():
                raise Stopped
            chunk = task.problems[start : start + batch]
            heads = [
                encode_prompt(tokenizer, with_target(p.prompt, task.budget, environment), task.prompting, tools) for p in chunk
            ]
            if rules is None:
                completions = greedy_tokens(model, tokenizer, heads, task.max_new_tokens, stop)
                texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
                lengths = [len(c) for c in completions]
            else:
                backend = TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id, threads=None)
                rows = [(head, i, p) for i, (head, p) in enumerate(zip(heads, chunk))]
                greedy = SamplingParams(temperature=0, max_tokens=task.max_new_tokens)
                replies = episode_replies(rewards, environment, tokenizer)
                episodes = run_episodes(backend, tokenizer, replies, rows, greedy, rules)
                texts = [completion_text(tokenizer, c.tokens) for c, _ in episodes]
                called += sum(_called_right(environment, tokenizer, p, c.tokens, flags) for p, (c, flags) in zip(chunk, episodes))
                lengths = [model_length(c.tokens, flags) for c, flags in episodes]
            total += sum(rewards.task_reward(text, p) for text, p in zip(texts, chunk, strict=True))
            within += sum(within_budget(length, task.budget) for length in lengths)
        metrics = {"heldout_accuracy": total / len(task.problems)}
        if rules is not None and hasattr(environment, "call_correct"):
            metrics["heldout_tool_calls"] = called / len(task.problems)
        if task.budget.alpha:
            metrics["heldout_within_budget"] = within / len(task.problems)
        return metrics
    finally:
        rewards.close()


def _called_right(
    environment: object, tokenizer: PreTrainedTokenizerBase, problem: Problem, tokens: list[int], flags: list[bool]
) -> bool:
    """Whether one of the episode's environment replies (its runs of unsampled tokens) answered a correct call."""
    judge = getattr(environment, "call_correct", None)
    replies: list[list[int]] = []
    for i, (token, sampled) in enumerate(zip(tokens, flags)):
        if not sampled:
            if i and not flags[i - 1]:
                replies[-1].append(token)
            else:
                replies.append([token])
    return judge is not None and any(judge(problem, completion_text(tokenizer, r)) for r in replies)
