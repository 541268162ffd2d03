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
   validator's logits, and each claimed logprob is the recomputed one, both within what the
   file's declared numerics explain (below).
6. ``rewards``: task reward, length penalty and reward recomputed and equal to the claimed ones.

Failures of integrity, toploc or sampling are *hard* (the node forged or corrupted work);
the others are *soft* (wrong or sloppy work, no credit for this submission only).

Numerics. A node and its validator rarely compute identically, so the prefill runs in the dtype
the file declares (:mod:`shared.numerics`: recomputing bf16 work in fp32 moved some logits by
7-10) and the sampling check is a test, not an equality:

- A token that is not the validator's argmax is a *deviation*. Its gap (best score minus the
  claimed token's, over the position's logit scale) decides what it can be: beyond the dtype's
  ``max_gap`` numerics cannot explain it, so it is forged (hard), except for the one outlier a
  bf16 file may hold (bf16 decode and prefill disagree wildly at rare positions: once in 20,032
  honest rows); within it, it is explainable.
- Honest deviations happen only at near-ties, at a known rate: a position whose top two scores
  are ``g`` apart flips with chance ``exp(-g / s) / 2``. Summed over the file that predicts how
  many an honest node makes; seeing more than the Poisson tail allows at ``numerics_alpha``
  (1e-6) fails the file *explained*: no credit, never a strike. This catches a node that picks
  many near-ties (or sampled with another seed or temperature where the model was unsure).
- A forger that picks only a few near-ties, towards the higher reward, stays inside that test,
  so every row with a deviation is left out of training (``untrained_rows``): its reward never
  reaches the trainer, whichever way numerics or a forger decided it. The node keeps the
  credit for the tokens; only the learning signal of rows a node could have steered is lost.
- Logprobs are bounded per token (``logprob_abs + logprob_rel * |logprob|``: the trainer's
  ratios use them, and one token 89 nats off is a NaN gradient) and per row in their signed
  mean (honest errors cancel; a forger's shift of every token does not).

The trade-off: a looser tolerance rejects fewer honest files and lets a forger steer more
tokens (all of them then untrained); a tighter one the reverse. With the measured tolerances,
``bench/verification.py`` prints both sides: honest rows rejected, forged files accepted, and
what a cherry-picker gains in reward that reaches the trainer.
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import torch
from pydantic import BaseModel, Field
from transformers import PreTrainedTokenizerBase

from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.environments.bounded import task_rewards
from intellect_protocol.shared.environments.length import model_length
from intellect_protocol.shared.environments.registry import Problem, Rewards, completion_text, reward
from intellect_protocol.shared.environments.turns import Rules
from intellect_protocol.shared.episodes import Replies, Twice, replay_walk, replies_to
from intellect_protocol.shared.inference import prefill_batch
from intellect_protocol.shared.numerics import Numerics, torch_dtype
from intellect_protocol.shared.rollout_file import ReadLimits, Rollout, RolloutFileError, read_numerics, read_rollouts
from intellect_protocol.shared.schemas import CHECKS, CheckName, CheckOutcome, Judgement, TaskSpec
from intellect_protocol.shared.tasks import assigned_rows, budget_of
from intellect_protocol.shared.tolerances import TOLERANCES, tolerance_for
from intellect_protocol.shared.toploc import ToplocThresholds, rollout_passes, verify_proofs_batch
from intellect_protocol.validator.sampling_check import judge_row, logprob_shift, rows_scores, shifted_rows


class CheckSettings(BaseModel):
    toploc: ToplocThresholds = ToplocThresholds()
    """When a proof chunk fails (the run's thresholds)."""
    numerics_alpha: float = Field(1e-6, gt=0, lt=1)
    """Chance that an honest file fails the deviation-count test (more near-tie deviations than its
    numerics predict); lower accepts more steered near-ties, all of them kept out of training."""
    reward_tolerance: float = Field(1e-6, ge=0)
    """Largest difference between a claimed and a recomputed reward, task reward or penalty."""
    prefill_batch: int = Field(16, ge=1)
    """Rows per batched prefill."""
    probe_rows: int = Field(2, ge=0)
    """The file's shortest rows, prefilled first on their own: a file forged throughout (a sybil's) is judged
    on them, and the rest is never prefilled. Any row found forged or unproven ends the prefill."""
    prefill_chunk: int | None = Field(None, ge=1)
    """Positions per prefill pass (over a KV cache); None: whole sequences at once."""
    reward_fraction: float = Field(1.0, gt=0, le=1)
    """Share of rows whose rewards are recomputed, for environments where that is expensive
    (which rows is decided by the file's hash, so a node cannot know in advance)."""


class Verdict(Judgement):
    untrained_rows: list[int]
    """Rows with an explainable deviation: accepted, but kept out of training."""


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
    environment: Rewards
    """Recomputes rewards: the run's environment, in a bounded process (a plugin's failure raises
    :class:`~shared.environments.bounded.PluginFailure`, which is no verdict on the node)."""
    problems: dict[str, Problem]
    rules: Rules | None = None
    """A multi-turn environment's episode rules (its ``environment`` then replays its replies); None: single-turn."""


def validate(data: bytes, ctx: Context, settings: CheckSettings | None = None) -> Verdict:
    settings = settings or CheckSettings()
    results: list[CheckOutcome] = []

    def record(name: CheckName, failures: list[str], ok_reason: str, explained: bool = False) -> bool:
        passed = not failures
        reason = (
            ok_reason if passed else "; ".join(failures[:3]) + (f" (and {len(failures) - 3} more)" if len(failures) > 3 else "")
        )
        results.append(CheckOutcome(name=name, passed=passed, reason=reason[:2000], explained=explained and not passed))
        return passed

    rollouts: list[Rollout] = []
    numerics = Numerics()
    if hashlib.sha256(data).hexdigest() != ctx.sha256:
        ok = record("integrity", ["the file's sha256 differs from the one stored at upload"], "")
    else:
        try:
            rules = ctx.rules
            limits = (
                ReadLimits(max_environment_tokens=rules.environment_tokens, max_environment_turns=rules.max_turns)
                if rules
                else None
            )
            rollouts, numerics = read_rollouts(data, limits), read_numerics(data)
            ok = record("integrity", [], f"{len(rollouts)} rows parse under the rollout schema; computed as {numerics}")
        except RolloutFileError as e:
            ok = record("integrity", [str(e)], "")
    ok = ok and record("assignment", _assignment(rollouts, ctx, numerics), "rows, prompts, seeds and policy step as assigned")
    ok = ok and record("termination", _termination(rollouts, ctx), "every completion ends with EOS or at the token limit")
    untrained: list[int] = []
    if ok and (replayed := _replay(rollouts, ctx)):
        ok = record("sampling", replayed, "")
    elif ok:
        prefill = _prefill_checks(rollouts, ctx, settings, numerics)
        ok = record("toploc", prefill.toploc, "every proof chunk verifies")
        if prefill.forged:
            ok = record("sampling", prefill.forged, "") and ok
        else:
            ok = record("sampling", prefill.too_many, prefill.summary, explained=True) and ok
        untrained = prefill.deviating_rows
    ok = ok and record("rewards", _rewards(rollouts, ctx, settings), "rewards recompute")
    done = {c.name for c in results}
    results += [
        CheckOutcome(name=name, passed=None, reason="not run: an earlier check failed") for name in CHECKS if name not in done
    ]
    return Verdict(checks=results, untrained_rows=untrained if all(c.passed for c in results) else [])


def _assignment(rollouts: list[Rollout], ctx: Context, numerics: Numerics) -> list[str]:
    task = ctx.task
    failures = []
    if tolerance_for(str(numerics), numerics.dtype, task.tolerances) is None:
        admitted = ", ".join(sorted(task.tolerances or {}))
        failures.append(
            f"the file was computed as {numerics}; the run was calibrated for {admitted} only and admits no other numerics"
        )
    if not ctx.oldest_step <= task.policy_step <= ctx.newest_step:
        failures.append(f"policy step {task.policy_step} is outside the run's window {ctx.oldest_step}..{ctx.newest_step}")
    try:
        expected = assigned_rows(task, ctx.problems, ctx.tokenizer)
    except KeyError as e:
        return [*failures, f"the task names an unknown problem {e}"]
    if len(rollouts) != len(expected):
        return [
            *failures,
            f"{len(rollouts)} rows for {len(expected)} assigned ({len(task.prompt_ids)} prompts x {task.samples_per_prompt})",
        ]
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
        elif ctx.rules is not None:
            continue  # an episode ends as its replay says (:func:`_replay`)
        elif params.stop_on_eos and eos in tokens[:-1]:
            failures.append(f"row {i}: goes on after EOS")
        elif r.finish_reason == "stop" and not (params.stop_on_eos and tokens[-1] == eos):
            failures.append(f"row {i}: says it stopped but does not end with EOS")
        elif r.finish_reason == "length" and (len(tokens) != params.max_tokens or params.stop_on_eos and tokens[-1] == eos):
            failures.append(f"row {i}: cut at {len(tokens)} tokens without EOS (limit {params.max_tokens})")
    return failures


@dataclass(frozen=True)
class PrefillFindings:
    toploc: list[str]
    forged: list[str]
    """Tokens or logprobs numerics cannot explain."""
    too_many: list[str]
    """More explainable deviations than numerics predict, if so."""
    deviating_rows: list[int]
    summary: str


@lru_cache(maxsize=4)
def in_dtype(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """``model`` computing in ``dtype`` as a node that loaded it in that dtype does: the model
    itself, or a copy (kept for the next file) whose parameters, and only those, are converted.
    ``Module.to`` would convert buffers too: rotary frequencies in bf16 move logits by whole units,
    and honest bf16 work failed against such a copy."""
    if next(model.parameters()).dtype == torch_dtype(dtype):
        return model
    converted = copy.deepcopy(model)
    for parameter in converted.parameters():
        parameter.data = parameter.data.to(torch_dtype(dtype))
    return converted


def _prefill_checks(rollouts: list[Rollout], ctx: Context, settings: CheckSettings, numerics: Numerics) -> PrefillFindings:
    params = ctx.task.sampling
    tolerance = tolerance_for(str(numerics), numerics.dtype, ctx.task.tolerances) or TOLERANCES[numerics.dtype]
    model = in_dtype(ctx.model, numerics.dtype)
    toploc: dict[int, str] = {}
    found: dict[int, str] = {}
    deviating_rows: list[int] = []
    deviations, expected, outliers = 0, 0.0, 0
    errors: list[torch.Tensor] = [torch.zeros(0)] * len(rollouts)
    # Rows of like length share a prefill, so little of it is spent on padding.
    order = sorted(range(len(rollouts)), key=lambda i: len(rollouts[i].prompt_tokens) + len(rollouts[i].completion_tokens))
    probe, rest = order[: settings.probe_rows], order[settings.probe_rows :]
    batches = [probe] * bool(probe) + [
        rest[start : start + settings.prefill_batch] for start in range(0, len(rest), settings.prefill_batch)
    ]
    for chosen in batches:
        if found or toploc:
            break  # the file fails whatever the rest holds
        batch = [rollouts[i] for i in chosen]
        rows = prefill_batch(
            model, [r.prompt_tokens for r in batch], [r.completion_tokens for r in batch], chunk=settings.prefill_chunk
        )
        verified = verify_proofs_batch([p.hidden for p in rows], [r.proofs for r in batch], settings.toploc)
        scores = rows_scores(list(zip(batch, rows)), params.temperature, params.top_p, tolerance)
        for i, r, chunks, scored in zip(chosen, batch, verified, scores, strict=True):
            if not rollout_passes(chunks):
                first = next(c for n, c in enumerate(chunks) if not c.ok)
                toploc[i] = f"row {i}: proof chunk {chunks.index(first)} fails ({first.reason})"
            row = judge_row(r, scored, params.temperature, tolerance)
            errors[i] = row.logprob_errors
            if row.forged:
                found[i] = f"row {i}: {row.forged}"
            elif row.deviations:
                deviating_rows.append(i)
            deviations += row.deviations
            expected += row.expected
            outliers += row.outliers
    deviating_rows.sort()
    forged = [found[i] for i in sorted(found)]
    forged += [f"row {i}: {shift}" for i, shift in shifted_rows(errors, tolerance).items()]
    if not forged and outliers > tolerance.outliers:
        forged.append(
            f"{outliers} tokens are not the seeded draw beyond what {numerics} numerics explain (at most {tolerance.outliers} a file)"
        )
    if not forged and (bias := logprob_shift(torch.cat(errors), tolerance)):
        forged.append(f"the file's {bias}")
    too_many = []
    chance = (
        float(
            torch.special.gammainc(
                torch.tensor(float(deviations), dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
            )
        )
        if deviations
        else 1.0
    )
    if chance < settings.numerics_alpha:
        too_many.append(
            f"{deviations} near-tie tokens differ from the seeded draw where {numerics} numerics predict {expected:.2f} "
            f"(chance {chance:.1e} for honest work): the file is not credited, and this is no strike"
        )
    summary = f"every token is the seeded sampler's draw under {numerics} numerics"
    if deviations:
        summary += (
            f" ({deviations} near-ties decided by numerics, {expected:.2f} expected; rows {deviating_rows[:8]} not trained)"
        )
    return PrefillFindings([toploc[i] for i in sorted(toploc)], forged, too_many, deviating_rows, summary)


@spent("episode replay")
def _replay(rollouts: list[Rollout], ctx: Context) -> list[str]:
    """A multi-turn file's rows whose environment tokens are not the environment's replay, or whose turns do not end
    where the node had to end them (:func:`shared.episodes.replay_walk`): forged tool output, a node's own tokens
    labelled as the environment's, or the reverse. All rows are walked in step, each step's replies asked at once."""
    if ctx.rules is None:
        return []
    environment = cast(Replies, ctx.environment)
    eos = ctx.tokenizer.eos_token_id if ctx.task.sampling.stop_on_eos else None
    walks = {
        i: replay_walk(r.completion_tokens, r.sampled, r.finish_reason, tokenizer=ctx.tokenizer, rules=ctx.rules, eos=eos)
        for i, r in enumerate(rollouts)
    }
    why: dict[int, str | None] = {}
    asked: dict[int, list[str]] = {}

    def step(i: int, answer: str | None) -> None:
        try:
            asked[i] = walks[i].send(answer)  # None starts a walk
        except StopIteration as done:
            why[i] = done.value

    for i in walks:
        step(i, None)
    # Every file's first row is replayed twice: a plugin whose replies are not a function of the turns is found
    # (PluginFailure: no verdict on the node) before any node is judged by its word.
    twice = Twice(environment)
    while asked:
        now, asked = asked, {}
        others = [i for i in now if i != 0]
        answers = replies_to(environment, [(ctx.problems[rollouts[i].prompt_id], rollouts[i].seed, now[i]) for i in others])
        replied = dict(zip(others, answers, strict=True))
        if 0 in now:
            replied[0] = twice.reply(ctx.problems[rollouts[0].prompt_id], rollouts[0].seed, now[0])
        for i, answer in replied.items():
            step(i, answer)
    return [f"row {i}: {why[i]}" for i in sorted(why) if why[i]]


@spent("reward check")
def _rewards(rollouts: list[Rollout], ctx: Context, settings: CheckSettings) -> list[str]:
    budget = budget_of(ctx.task)
    failures = []
    picker = random.Random(ctx.sha256)
    checked = [i for i in range(len(rollouts)) if settings.reward_fraction >= 1 or picker.random() < settings.reward_fraction]
    texts = [
        (completion_text(ctx.tokenizer, rollouts[i].completion_tokens), ctx.problems[rollouts[i].prompt_id]) for i in checked
    ]
    for i, task_reward in zip(checked, task_rewards(ctx.environment, texts), strict=True):
        r = rollouts[i]
        final, penalty = reward(task_reward, model_length(r.completion_tokens, r.sampled), budget)
        for name, claimed, recomputed in (
            ("task_reward", r.task_reward, task_reward),
            ("length_penalty", r.length_penalty, penalty),
            ("reward", r.reward, final),
        ):
            if not abs(claimed - recomputed) <= settings.reward_tolerance:
                failures.append(f"row {i}: {name} {claimed:g} claimed, {recomputed:g} recomputed")
    return failures
