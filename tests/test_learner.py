"""The learner's step on the shipped model: micro-batches add up to the whole batch's step, and a
stop between them gives the step up before it changes a weight; a micro-batch holds rows of like length."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.rollout_file import Rollout
from intellect_protocol.trainer.data import Batch, Group
from intellect_protocol.trainer.distributed import placement
from intellect_protocol.trainer.learner import Abandoned, Learner, micro_batches
from intellect_protocol.trainer.settings import TrainerSettings

pytestmark = pytest.mark.unit

torch.set_num_threads(1)


def _batch(groups: int = 3, samples: int = 4) -> Batch:
    """Rollouts of random tokens whose recorded logprobs are near the model's, with varied rewards."""
    rng = random.Random(0)
    made = []
    for g in range(groups):
        prompt = [1, *(rng.randrange(3, 18) for _ in range(rng.randrange(4, 9)))]
        rollouts = []
        for _ in range(samples):
            completion = [rng.randrange(3, 18) for _ in range(rng.randrange(3, 12))]
            reward = float(rng.random() < 0.5)
            rollouts.append(
                Rollout(
                    task_id=f"t{g}",
                    run_id="r",
                    policy_step=0,
                    prompt_id=f"p{g}",
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    logprobs=[-2.5 + rng.uniform(-0.1, 0.1) for _ in completion],
                    finish_reason="length",
                    reward=reward,
                    task_reward=reward,
                    length_penalty=0.0,
                    target_length=0,
                    seed=0,
                    proofs=b"",
                )  # fmt: skip
            )
        made.append(Group((f"t{g}", f"p{g}"), rollouts))
    return Batch(groups=made)


def _stepped(micro_batch: int, stop: threading.Event | None = None) -> tuple[Learner, dict[str, float]]:
    model, _ = load_model()
    learner = Learner(model, TrainerSettings(micro_batch=micro_batch), 1.0, placement())
    return learner, learner.step(_batch(), 0, stop)


def test_micro_batches_take_the_whole_batch_step() -> None:
    base, _ = load_model()
    whole, whole_metrics = _stepped(micro_batch=1000)
    parts, part_metrics = _stepped(micro_batch=5)  # 12 sequences in 3 micro-batches
    # Compared as updates, as Adam's are sensitive to summation order where a gradient is near its
    # eps (measured: 5e-5 of an update in norm, 0.2 % of the largest update elementwise). The
    # gradient's size, to which Adam is blind, is compared as grad_norm among the metrics below.
    with torch.no_grad():
        for (name, a), b, start in zip(whole.model.named_parameters(), parts.model.parameters(), base.parameters()):
            ours, theirs = b - start, a - start
            assert float((ours - theirs).norm()) <= 1e-3 * float(theirs.norm()), name
            assert float((ours - theirs).abs().max()) <= 0.02 * float(theirs.abs().max()), name
    assert whole_metrics.keys() == part_metrics.keys()
    for key, value in whole_metrics.items():
        assert part_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert whole.optimizer_steps == parts.optimizer_steps == TrainerSettings().optimizer_steps


def test_micro_batches_hold_sequences_of_like_length_and_every_one_once() -> None:
    lengths = [200, 30, 390, 35, 210, 380, 32, 205, 400]
    parts = [p.tolist() for p in micro_batches(lengths, 3)]
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert [sorted(lengths[i] for i in p) for p in parts] == [[30, 32, 35], [200, 205, 210], [380, 390, 400]]
    # Padded to each one's longest: 35 + 210 + 400 positions a row, against 400 a row in arrival order.
    assert [max(lengths[i] for i in p) for p in parts] == [35, 210, 400]


class _SetAfter(threading.Event):
    """Reads as set from its ``checks + 1``-th check on: a stop arriving mid-step."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks

    def is_set(self) -> bool:
        self.checks -= 1
        return self.checks < 0


def test_a_stop_between_micro_batches_gives_the_step_up_unchanged() -> None:
    before, _ = load_model()
    stop = _SetAfter(2)  # after two of the first optimizer step's three micro-batches
    model, _ = load_model()
    learner = Learner(model, TrainerSettings(micro_batch=5), 1.0, placement())
    with pytest.raises(Abandoned):
        learner.step(_batch(), 0, stop)
    assert learner.optimizer_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before.parameters(), model.parameters()))


def test_the_environments_tokens_are_context_never_trained_on() -> None:
    """In a multi-turn episode the environment's tokens (a tool's output) shape what the model reads next but were
    never its choices: whatever is recorded for them, the step is the same."""

    def with_tool_output(recorded: float) -> Batch:
        batch = _batch()
        for group in batch.groups:
            for r in group.rollouts:
                flags = [i % 4 not in (1, 2) for i in range(len(r.completion_tokens))]  # every fourth pair: the tool's
                r.sampled = flags
                r.logprobs = [lp if s else recorded for lp, s in zip(r.logprobs, flags)]
        return batch

    weights = []
    for recorded in (0.0, -9.0):
        model, _ = load_model()
        Learner(model, TrainerSettings(micro_batch=4), 1.0, placement()).step(with_tool_output(recorded), 0)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])
    # Recorded logprobs of sampled tokens do move the step: the test can tell a masked token from a trained one.
    model, _ = load_model()
    batch = with_tool_output(0.0)
    batch.groups[0].rollouts[0].logprobs[0] -= 3.0
    Learner(model, TrainerSettings(micro_batch=4), 1.0, placement()).step(batch, 0)
    assert not torch.equal(weights[0], torch.cat([p.detach().flatten() for p in model.parameters()]))
