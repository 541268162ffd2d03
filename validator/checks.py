"""Every check a validator runs on one submitted rollout file, each with a named result.

In order, cheapest first; the expensive ones (one batched prefill) run only when the cheap
ones pass, so garbage costs a validator almost nothing:

1. ``integrity``: the bytes hash to what the coordinator stored; the file parses under the
   strict rollout schema and value bounds (the node's signature over the upload was checked
   by the coordinator when it stored them).
2. ``assignment``: the rows are exactly the task's rows (prompts, prompt tokens, seeds, sample
   count, task and run ids, target lengths) at the leased policy step, and that step is
   within the run's allowed staleness.
3. ``termination``: each completion ends with EOS (reason ``stop``) or exactly at the token
   limit (``length``), with no EOS before its end.
4. ``toploc``: the proofs verify chunk by chunk against the validator's own hidden states.
5. ``sampling``: each token is the argmax of ``logits / T + noise(seed, position)`` under the
   validator's logits, allowing near-ties (a margin) and a small fraction of numerical
   disagreement; claimed logprobs match the recomputed ones.
6. ``rewards``: task reward, length penalty and reward recomputed and equal to the claimed ones.

Failures of integrity, toploc or sampling are *hard* (the node forged or corrupted work);
the others are *soft* (wrong or sloppy work, no credit for this submission only).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

import torch
from pydantic import BaseModel, Field
from transformers import PreTrainedTokenizerBase

from shared.environments.registry import Environment, Problem, reward
from shared.inference import prefill_batch
from shared.rollout_file import Rollout, RolloutFileError, read_rollouts
from shared.sampling import sampling_scores, token_logprobs
from shared.schemas import TaskSpec
from shared.tasks import assigned_rows, budget_of
from shared.toploc import ToplocThresholds, rollout_passes, verify_proofs

HARD = frozenset({"integrity", "toploc", "sampling"})
ORDER = ("integrity", "assignment", "termination", "toploc", "sampling", "rewards")


class CheckSettings(BaseModel):
    toploc: ToplocThresholds = ToplocThresholds()
    """When a proof chunk fails (the run's thresholds)."""
    sampling_margin: float = Field(0.05, ge=0)
    """A claimed token whose score is within this of the best one counts as a near-tie, not a mismatch."""
    sampling_mismatch_fraction: float = Field(0.0, ge=0, le=1)
    """Largest fraction of a completion's tokens that may disagree beyond the margin. 0 by default:
    each allowed disagreement is a token a forger may choose freely; raise it only for nodes whose
    numerics differ from the validator's (e.g. bf16 GPUs checked in fp32)."""
    logprob_tolerance: float = Field(0.02, ge=0)
    """Largest mean absolute difference between claimed and recomputed token logprobs."""
    reward_tolerance: float = Field(1e-6, ge=0)
    """Largest difference between a claimed and a recomputed reward, task reward or penalty."""
    prefill_batch: int = Field(16, ge=1)
    """Rows per batched prefill."""
    prefill_chunk: int | None = Field(None, ge=1)
    """Positions per prefill pass (over a KV cache); None: whole sequences at once."""
    reward_fraction: float = Field(1.0, gt=0, le=1)
    """Share of rows whose rewards are recomputed, for environments where that is expensive
    (which rows is decided by the file's hash, so a node cannot know in advance)."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool | None
    """None: not run, because an earlier check failed."""
    reason: str


@dataclass(frozen=True)
class Verdict:
    checks: list[CheckResult]

    @property
    def accepted(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def hard(self) -> bool:
        return any(c.passed is False and c.name in HARD for c in self.checks)

    @property
    def reason(self) -> str:
        failed = [f"{c.name}: {c.reason}" for c in self.checks if c.passed is False]
        return "; ".join(failed) if failed else "all checks passed"


@dataclass(frozen=True)
class Context:
    """What a validator knows about a submission besides its bytes."""

    task: TaskSpec
    sha256: str
    oldest_step: int
    """The oldest policy step the run still accepts (its current step minus the async level)."""
    newest_step: int
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    environment: Environment
    problems: dict[str, Problem]


def validate(data: bytes, ctx: Context, settings: CheckSettings | None = None) -> Verdict:
    settings = settings or CheckSettings()
    results: list[CheckResult] = []

    def record(name: str, failures: list[str], ok_reason: str) -> bool:
        passed = not failures
        reason = ok_reason if passed else "; ".join(failures[:3]) + (f" (and {len(failures) - 3} more)" if len(failures) > 3 else "")
        results.append(CheckResult(name, passed, reason))
        return passed

    rollouts: list[Rollout] = []
    if hashlib.sha256(data).hexdigest() != ctx.sha256:
        ok = record("integrity", ["the file's sha256 differs from the one stored at upload"], "")
    else:
        try:
            rollouts = read_rollouts(data)
            ok = record("integrity", [], f"{len(rollouts)} rows parse under the rollout schema")
        except RolloutFileError as e:
            ok = record("integrity", [str(e)], "")
    ok = ok and record("assignment", _assignment(rollouts, ctx), "rows, prompts, seeds and policy step as assigned")
    ok = ok and record("termination", _termination(rollouts, ctx), "every completion ends with EOS or at the token limit")
    if ok:
        toploc, sampling = _prefill_checks(rollouts, ctx, settings)
        ok = record("toploc", toploc, "every proof chunk verifies")
        ok = record("sampling", sampling, "every token is the seeded sampler's draw") and ok
    ok = ok and record("rewards", _rewards(rollouts, ctx, settings), "rewards recompute")
    done = {c.name for c in results}
    results += [CheckResult(name, None, "not run: an earlier check failed") for name in ORDER if name not in done]
    return Verdict(results)


def _assignment(rollouts: list[Rollout], ctx: Context) -> list[str]:
    task = ctx.task
    failures = []
    if not ctx.oldest_step <= task.policy_step <= ctx.newest_step:
        failures.append(f"policy step {task.policy_step} is outside the run's window {ctx.oldest_step}..{ctx.newest_step}")
    try:
        expected = assigned_rows(task, ctx.problems, ctx.tokenizer)
    except KeyError as e:
        return [*failures, f"the task names an unknown problem {e}"]
    if len(rollouts) != len(expected):
        return [*failures, f"{len(rollouts)} rows for {len(expected)} assigned ({len(task.prompt_ids)} prompts x {task.samples_per_prompt})"]
    target = task.target_length if task.length_alpha else 0
    for i, (r, want) in enumerate(zip(rollouts, expected)):
        wrong = [
            name
            for name, claimed, assigned in (
                ("task_id", r.task_id, task.task_id),
                ("run_id", r.run_id, task.run_id),
                ("policy_step", r.policy_step, task.policy_step),
                ("prompt_id", r.prompt_id, want.problem.id),
                ("prompt_tokens", r.prompt_tokens, want.prompt_tokens),
                ("seed", r.seed, want.seed),
                ("target_length", r.target_length, target),
            )
            if claimed != assigned
        ]
        if wrong:
            failures.append(f"row {i}: {', '.join(wrong)} not as assigned")
    return failures


def _termination(rollouts: list[Rollout], ctx: Context) -> list[str]:
    params, eos = ctx.task.sampling, ctx.tokenizer.eos_token_id
    failures = []
    for i, r in enumerate(rollouts):
        tokens = r.completion_tokens
        if not 1 <= len(tokens) <= params.max_tokens:
            failures.append(f"row {i}: {len(tokens)} tokens, limit {params.max_tokens}")
        elif params.stop_on_eos and eos in tokens[:-1]:
            failures.append(f"row {i}: goes on after EOS")
        elif r.finish_reason == "stop" and not (params.stop_on_eos and tokens[-1] == eos):
            failures.append(f"row {i}: says it stopped but does not end with EOS")
        elif r.finish_reason == "length" and (len(tokens) != params.max_tokens or params.stop_on_eos and tokens[-1] == eos):
            failures.append(f"row {i}: cut at {len(tokens)} tokens without EOS (limit {params.max_tokens})")
    return failures


def _prefill_checks(rollouts: list[Rollout], ctx: Context, settings: CheckSettings) -> tuple[list[str], list[str]]:
    params = ctx.task.sampling
    toploc, sampling = [], []
    for start in range(0, len(rollouts), settings.prefill_batch):
        batch = rollouts[start : start + settings.prefill_batch]
        states = prefill_batch(
            ctx.model, [r.prompt_tokens for r in batch], [r.completion_tokens for r in batch], chunk=settings.prefill_chunk
        )
        for i, (r, (hidden, logits)) in enumerate(zip(batch, states), start):
            if not rollout_passes(chunks := verify_proofs(hidden, r.proofs, settings.toploc)):
                first = next(c for n, c in enumerate(chunks) if not c.ok)
                toploc.append(f"row {i}: proof chunk {chunks.index(first)} fails ({first.reason})")
            tokens = torch.tensor(r.completion_tokens)
            n = len(tokens)
            scores = sampling_scores(
                logits, torch.full((n,), r.seed, dtype=torch.int64), torch.arange(n), params.temperature, params.top_p
            )
            claimed = scores.gather(-1, tokens[:, None])[:, 0]
            disagree = int((~(claimed >= scores.max(-1).values - settings.sampling_margin)).sum())
            allowed = math.floor(settings.sampling_mismatch_fraction * n)
            if disagree > allowed:
                sampling.append(f"row {i}: {disagree} of {n} tokens are not the seeded draw (allowed {allowed})")
                continue
            drift = float((token_logprobs(logits, tokens, params.temperature) - torch.tensor(r.logprobs)).abs().mean())
            if not drift <= settings.logprob_tolerance:
                sampling.append(f"row {i}: logprobs differ by {drift:.4f} on average (allowed {settings.logprob_tolerance})")
    return toploc, sampling


def _rewards(rollouts: list[Rollout], ctx: Context, settings: CheckSettings) -> list[str]:
    budget = budget_of(ctx.task)
    failures = []
    picker = random.Random(ctx.sha256)
    for i, r in enumerate(rollouts):
        if settings.reward_fraction < 1 and picker.random() >= settings.reward_fraction:
            continue
        text = ctx.tokenizer.decode(r.completion_tokens, skip_special_tokens=True)
        task_reward = ctx.environment.task_reward(text, ctx.problems[r.prompt_id])
        final, penalty = reward(task_reward, len(r.completion_tokens), budget)
        for name, claimed, recomputed in (("task_reward", r.task_reward, task_reward), ("length_penalty", r.length_penalty, penalty), ("reward", r.reward, final)):
            if not abs(claimed - recomputed) <= settings.reward_tolerance:
                failures.append(f"row {i}: {name} {claimed:g} claimed, {recomputed:g} recomputed")
    return failures
