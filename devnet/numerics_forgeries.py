"""Forgeries that hide inside numerical tolerance, for the tests and ``bench/verification.py``.

Each takes an honest task's generation and returns the file a cheating node would upload,
built with the node's own code (rewards, proofs, format) so only the forged part differs:

- :func:`cherry_pick`: at near-ties (top-2 scores closer than the declared dtype's tolerance),
  take the runner-up, sample the rest with the assigned seed, keep the branch of higher reward;
  ``every=True`` takes every such near-tie that raises the reward, in order.
- :func:`shifted_logprobs`: claimed logprobs moved, on every token or on one.
- :func:`resampled`: the rows sampled with another seed or temperature than assigned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from intellect_protocol.node.work import Generated, finish, rewards_for
from intellect_protocol.shared.environments.registry import completion_text, reward
from intellect_protocol.shared.inference import Completion, prefill
from intellect_protocol.shared.models import load_tokenizer
from intellect_protocol.shared.sampling import sample, sampling_scores, token_logprobs
from intellect_protocol.shared.tasks import AssignedRow
from intellect_protocol.shared.tolerances import TOLERANCES


def continue_seeded(
    model: torch.nn.Module, prompt: list[int], prefix: list[int], seed: int, generated: Generated, eos: int
) -> list[int]:
    """``prefix`` continued with the seeded sampler (position by position, as an honest node would)."""
    params = generated.task.sampling
    tokens = list(prefix)
    while len(tokens) < params.max_tokens and not (params.stop_on_eos and tokens and tokens[-1] == eos):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + tokens], device=next(model.parameters()).device)).logits[:, -1].float()
        token, _ = sample(logits, torch.tensor([seed]), torch.tensor([len(tokens)]), params.temperature, params.top_p)
        tokens.append(int(token))
    return tokens


def completion_of(model: torch.nn.Module, prompt: list[int], tokens: list[int], generated: Generated, eos: int) -> Completion:
    """What the node's backend would have returned for ``tokens``: logprobs and proof states from one prefill."""
    with torch.inference_mode():
        hidden, logits = prefill(model, prompt, tokens)
    logprobs = token_logprobs(logits.float(), torch.tensor(tokens), generated.task.sampling.temperature).tolist()
    finish_reason = "stop" if generated.task.sampling.stop_on_eos and tokens[-1] == eos else "length"
    return Completion(tokens=tokens, logprobs=logprobs, hidden=hidden.to(torch.bfloat16), finish_reason=finish_reason)  # type: ignore[arg-type]


def _reward(row: AssignedRow, tokens: list[int], generated: Generated) -> float:
    tokenizer = load_tokenizer(generated.task.model)
    task_reward = rewards_for(generated.task.environment, generated.task.environment_version).task_reward(
        completion_text(tokenizer, tokens), row.problem
    )
    return reward(task_reward, len(tokens), generated.budget)[0]


def _near_ties(
    model: torch.nn.Module, prompt: list[int], tokens: list[int], seed: int, generated: Generated, slack: float
) -> list[tuple[int, int]]:
    """(position, runner-up token) wherever the runner-up is within ``slack`` of the logit scale."""
    params = generated.task.sampling
    with torch.inference_mode():
        _, logits = prefill(model, prompt, tokens)
    logits = logits.float()
    n = len(tokens)
    scores = sampling_scores(logits, torch.full((n,), seed), torch.arange(n), params.temperature, params.top_p)
    scale = logits.abs().amax(-1) / (params.temperature or 1.0)
    top2 = scores.topk(2, dim=-1)
    gap = (top2.values[:, 0] - top2.values[:, 1]) / scale
    return [(t, int(top2.indices[t, 1])) for t in range(n) if gap[t] < slack and int(top2.indices[t, 0]) == tokens[t]]


def cherry_pick(
    generated: Generated,
    model: torch.nn.Module,
    eos: int,
    every: bool = False,
    tries: int = 8,
    objective: Callable[[AssignedRow, list[int], Generated], float] | None = None,
) -> tuple[bytes, set[int]]:
    """The file with near-ties taken towards the higher reward, and the rows that were changed.
    ``objective`` is what the forger steers towards instead of the reward (on a random model, whose
    rewards are all 0, anything else it can prefer)."""
    value = objective or _reward
    slack = TOLERANCES[generated.numerics.dtype].max_gap
    completions, changed = list(generated.completions), set()
    for index, (row, completion) in enumerate(zip(generated.rows, generated.completions)):
        best_tokens, best_reward = completion.tokens, value(row, completion.tokens, generated)
        start, attempts = 0, 0
        while attempts < tries:
            ties = [
                (t, alt) for t, alt in _near_ties(model, row.prompt_tokens, best_tokens, row.seed, generated, slack) if t >= start
            ]
            improved = False
            for t, alt in ties:
                attempts += 1
                branch = continue_seeded(model, row.prompt_tokens, best_tokens[:t] + [alt], row.seed, generated, eos)
                if (r := value(row, branch, generated)) > best_reward:
                    best_tokens, best_reward, start, improved = branch, r, t + 1, True
                    break
                if attempts >= tries:
                    break
            if not (improved and every):
                break
        if best_tokens != completion.tokens:
            completions[index] = completion_of(model, row.prompt_tokens, best_tokens, generated, eos)
            changed.add(index)
    return finish(dataclasses.replace(generated, completions=completions)).data, changed


def shifted_logprobs(generated: Generated, shift: float, every_token: bool) -> bytes:
    """Claimed logprobs moved by ``shift`` nats (kept <= 0), on every token or on each row's least likely
    one (where the most can be moved)."""
    completions = []
    for c in generated.completions:
        target = min(range(len(c.logprobs)), key=c.logprobs.__getitem__)
        moved = [min(0.0, lp + shift) if every_token or i == target else lp for i, lp in enumerate(c.logprobs)]
        completions.append(dataclasses.replace(c, logprobs=moved))
    return finish(dataclasses.replace(generated, completions=completions)).data


def resampled(
    generated: Generated, model: torch.nn.Module, eos: int, seed_offset: int = 0, temperature: float | None = None
) -> bytes:
    """Rows sampled with seeds ``seed + seed_offset`` and/or another temperature, proven and scored honestly."""
    params = generated.task.sampling
    other = dataclasses.replace(
        generated,
        task=generated.task.model_copy(
            update={"sampling": params.model_copy(update={"temperature": temperature or params.temperature})}
        ),
    )
    completions = []
    for row in generated.rows:
        tokens = continue_seeded(model, row.prompt_tokens, [], row.seed + seed_offset, other, eos)
        completions.append(completion_of(model, row.prompt_tokens, tokens, generated, eos))
    return finish(dataclasses.replace(generated, completions=completions)).data
