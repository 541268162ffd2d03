"""Verification under real numerics (fast versions of ``bench/verification.py``): honest bf16
nodes are not punished, forgers that hide in the tolerance gain nothing the trainer sees, and a
disagreement numerics explain is never a strike, through the real API down to the trainer."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch
from eth_account import Account

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import Node
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.numerics_forgeries import cherry_pick, resampled, shifted_logprobs
from intellect_protocol.node.work import finish, generate, torch_backend_for
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.rollout_file import Rollout, read_numerics, read_rollouts
from intellect_protocol.shared.sampling import token_logprobs
from intellect_protocol.shared.schemas import CHECKS, SamplingParams
from intellect_protocol.shared.tolerances import TOLERANCES
from intellect_protocol.trainer.data import fetch_accepted
from intellect_protocol.validator.checks import CheckSettings, Context, Verdict, in_dtype, validate
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import make_run, signed_post, verdict_body
from tests.support.adversary import tiny
from tests.support.checks import arithmetic, make_task
from tests.support.protocol import grant, joined, lease, upload

torch.set_num_threads(1)


def check(data: bytes, task, batch: int = 16) -> Verdict:
    ctx = Context(task, hashlib.sha256(data).hexdigest(), 0, 0, *tiny(), *arithmetic())
    return validate(data, ctx, CheckSettings(prefill_batch=batch))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_honest_nodes_pass_in_their_own_numerics(dtype: str) -> None:
    rows = 0
    for i in range(8):
        task = make_task(900 + i, prompts=4, samples=4, temperature=(0.5, 1.0, 1.2)[i % 3], max_tokens=96)
        data = finish(generate(task, "torch", dtype)).data
        assert read_numerics(data) == Numerics("torch", dtype)
        verdict = check(data, task, batch=(1, 16, 64)[i % 3])
        assert verdict.accepted, verdict.reason
        rows += len(read_rollouts(data))
        assert len(verdict.untrained_rows) <= 2  # a near-tie decided by numerics now and then, no more
    assert rows == 128


def test_near_tie_cherry_picking_never_reaches_training() -> None:
    model = torch_backend_for("tiny-arith", "bfloat16")[0].model
    changed_total = 0
    for i in range(4):
        task = make_task(950 + i, prompts=4, samples=4, temperature=1.0, max_tokens=96)
        data, changed = cherry_pick(generate(task, "torch", "bfloat16"), model, tiny()[1].eos_token_id, every=True)
        verdict = check(data, task)
        changed_total += len(changed)
        assert not verdict.hard, verdict.reason  # steering near-ties is not provable forgery...
        if verdict.accepted:
            assert changed <= set(verdict.untrained_rows)  # ...but no steered row is trained on
    assert changed_total > 0  # the forger found near-ties to steer


@pytest.mark.parametrize(
    "forgery,dtype",
    [
        (lambda g: shifted_logprobs(g, -89.0, every_token=False), "bfloat16"),  # a NaN gradient once
        (lambda g: shifted_logprobs(g, -89.0, every_token=False), "float32"),
        (lambda g: shifted_logprobs(g, 0.8, every_token=False), "float32"),
        (lambda g: shifted_logprobs(g, 0.019, every_token=True), "float32"),
        (
            lambda g: resampled(
                g, torch_backend_for("tiny-arith", g.numerics.dtype)[0].model, tiny()[1].eos_token_id, seed_offset=1
            ),
            "bfloat16",
        ),
        (
            lambda g: resampled(
                g, torch_backend_for("tiny-arith", g.numerics.dtype)[0].model, tiny()[1].eos_token_id, temperature=1.4
            ),
            "bfloat16",
        ),
    ],
    ids=[
        "logprob-89-bf16",
        "logprob-89-fp32",
        "logprob+0.8-fp32",
        "logprob+0.019-all-fp32",
        "other-seed-bf16",
        "other-temperature-bf16",
    ],
)
def test_forgeries_beyond_numerics_are_hard_rejections(forgery, dtype: str) -> None:
    task = make_task(990, prompts=4, samples=4, temperature=1.0, max_tokens=96)
    verdict = check(forgery(generate(task, "torch", dtype)), task)
    assert not verdict.accepted and verdict.hard, verdict.reason
    assert "sampling" in {c.name for c in verdict.checks if c.passed is False}


PASSED = [{"name": name, "passed": True, "reason": "ok"} for name in CHECKS]


def test_explained_rejections_are_no_strike_and_untrained_rows_stay_out_of_training(sqlite_url: str, tmp_path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        soft_rejections_per_strike=1,
        max_leases_per_node=8,
    )
    with serve(settings) as served:
        run_id = make_run(served, sampling=SamplingParams(temperature=1.0, max_tokens=48), prompts=1, samples=4)
        token = admin_token(served)
        validator, trainer = Account.create(), Account.create()
        grant(served, token, validator.address, "validator")
        grant(served, token, trainer.address, "trainer")
        node = joined(served)

        def judged(checks: list[dict] = PASSED, untrained_rows: list[int] = ()) -> dict:
            task = lease(served, node)
            upload(served, node, task, finish(generate(task)).data)
            [claim] = signed_post(
                served.url, "/v1/validation/claim", validator, served.audience, {"address": validator.address, "limit": 1}
            ).json()
            body = verdict_body(served.audience, validator, claim, checks, untrained_rows)
            reply = signed_post(served.url, "/v1/validation/verdicts", validator, served.audience, body)
            assert reply.status_code == 200, reply.text
            return reply.json()

        for _ in range(3):  # one soft rejection a strike, yet explained ones cost nothing
            checks = [
                *PASSED[:4],
                {"name": "sampling", "passed": False, "reason": "3 near-ties, 0.2 expected", "explained": True},
                {"name": "rewards", "passed": None, "reason": "not run"},
            ]
            receipt = judged(checks)
            assert receipt["status"] == "rejected" and receipt["hard"] is False and "no strike" in receipt["reason"]
        with make_sessionmaker(served.engine)() as session:
            assert session.get_one(Node, node.address).strikes == 0

        accepted = judged(untrained_rows=[2, 0])
        assert accepted["status"] == "accepted" and accepted["untrained_rows"] == [0, 2]
        with CoordinatorClient(served.url, trainer) as api:
            [(entry, rows)] = fetch_accepted(api, run_id, 0, 0)
        assert entry.untrained_rows == [0, 2] and rows is not None and len(rows) == 2


def test_the_validators_bf16_copy_computes_what_a_bf16_node_computes() -> None:
    node_model = torch_backend_for("tiny-arith", "bfloat16")[0].model  # loaded in bf16, as a node does
    tokens = torch.randint(3, tiny()[0].config.vocab_size, (1, 90), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(in_dtype(tiny()[0], "bfloat16")(tokens).logits, node_model(tokens).logits)
    assert in_dtype(tiny()[0], "float32") is tiny()[0]


def test_one_far_token_a_bf16_file_is_an_outlier_two_are_forgery() -> None:
    from intellect_protocol.validator.sampling_check import row_sampling

    logits = torch.zeros(6, 8)
    logits[:, 0] = 10.0  # token 0 wins every position by far, whatever the noise
    honest = Rollout(
        task_id="t",
        run_id="r",
        policy_step=0,
        prompt_id="p",
        prompt_tokens=[1],
        completion_tokens=[0] * 6,
        logprobs=token_logprobs(logits, torch.zeros(6, dtype=torch.long), 1.0).tolist(),
        finish_reason="length",
        reward=0.0,
        task_reward=0.0,
        length_penalty=0.0,
        target_length=0,
        seed=3,
        proofs=b"",
    )
    one = dataclasses.replace(honest, completion_tokens=[0, 0, 5, 0, 0, 0])
    two = dataclasses.replace(honest, completion_tokens=[0, 5, 0, 0, 5, 0])
    whole, split = [(0, logits)], [(0, logits[:4]), (4, logits[4:])]  # read at once, or in blocks of positions
    for blocks in (whole, split):
        assert row_sampling(honest, blocks, 1.0, 1.0, TOLERANCES["bfloat16"]).forged is None
        row = row_sampling(one, blocks, 1.0, 1.0, TOLERANCES["bfloat16"])
        assert row.forged is None and row.outliers == 1 and row.deviations == 1
        assert row_sampling(two, blocks, 1.0, 1.0, TOLERANCES["bfloat16"]).forged
        assert row_sampling(one, blocks, 1.0, 1.0, TOLERANCES["float32"]).forged


def test_a_calibrated_run_judges_by_its_own_bounds_and_admits_only_its_numerics() -> None:
    from intellect_protocol.devnet.numerics_forgeries import shifted_logprobs

    task = make_task(996, prompts=2, samples=4, temperature=1.0, max_tokens=48)
    generated = generate(task, "torch", "float32")
    shifted = shifted_logprobs(generated, 0.019, every_token=True)  # beyond the fp32 floor's bias bound (0.001)
    assert not check(shifted, task).accepted
    # A run whose model was measured to shift honest fp32 logprobs that far admits it; a bound is never below the floor.
    calibrated = {"torch/float32": TOLERANCES["float32"].widened({"logprob_bias": 0.05, "logprob_abs": 0.05, "max_gap": 0.0})}
    assert calibrated["torch/float32"].max_gap == TOLERANCES["float32"].max_gap
    assert check(shifted, task.model_copy(update={"tolerances": calibrated})).accepted
    # bf16 work on a run calibrated for fp32 only: refused as unassigned numerics (soft: no strike), not judged.
    bf16 = finish(generate(task, "torch", "bfloat16")).data
    verdict = check(bf16, task.model_copy(update={"tolerances": calibrated}))
    assert not verdict.accepted and not verdict.hard
    assert "computed as torch/bfloat16; the run was calibrated for torch/float32 only" in verdict.reason
    assert check(bf16, task).accepted  # an uncalibrated run admits any numerics, at the floors


def test_a_rows_logprob_shift_is_judged_by_the_spread_of_the_whole_file_or_its_own() -> None:
    from intellect_protocol.validator.sampling_check import shifted_rows

    noise = torch.Generator().manual_seed(0)
    bf16 = TOLERANCES["bfloat16"]
    honest = [torch.randn(48, generator=noise) * 0.005 for _ in range(15)]
    # One token, 0.0064 nats off: within a bf16 token's rounding (the file's spread), though beyond the bias
    # bound alone. Judged by its own spread (none), an honest Gemma 3 row like it was once rejected.
    assert shifted_rows([*honest, torch.tensor([0.0064])], bf16) == {}
    # Every token of one row moved the same way, by less than one token's rounding: the shift is seen.
    moved = honest[3] + 0.01
    assert list(shifted_rows([*honest[:3], moved, *honest[4:]], bf16)) == [3]
    # A row pushed far is caught whatever spread it is judged by.
    assert list(shifted_rows([honest[0] + 0.3, *honest[1:]], bf16)) == [0]
    assert shifted_rows([torch.tensor([0.2])], bf16) == {}  # one token alone: the per-token bound judges it
    # An honest row of uncertain tokens rounds more than the file's near-certain ones: judged by its own spread.
    noisy = torch.randn(42, generator=noise) * 0.05 + 0.0137
    assert shifted_rows([*honest, noisy], bf16) == {}


def test_rows_scored_together_in_packed_blocks_score_as_each_row_alone() -> None:
    """The validator scores a prefill batch's rows at once, their positions packed into shared blocks of
    logits (here of 7 positions, so blocks join the end of one row to the start of the next)."""
    from intellect_protocol.shared.inference import prefill_batch, vocab_size
    from intellect_protocol.validator.sampling_check import row_scores, rows_scores

    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 18, (n,), generator=gen).tolist() for n in (4, 9, 2)]
    completions = [torch.randint(3, 18, (n,), generator=gen).tolist() for n in (11, 3, 16)]
    rows = [
        Rollout("t", "r", 0, "p", p, c, [0.0] * len(c), "length", 0.0, 0.0, 0.0, 0, seed, b"")
        for p, c, seed in zip(prompts, completions, (7, 8, 9))
    ]
    prefilled = prefill_batch(tiny()[0], prompts, completions)
    together = rows_scores(list(zip(rows, prefilled)), 1.0, 0.9, TOLERANCES["float32"], max_bytes=7 * 4 * vocab_size(tiny()[0]))
    for r, p, scored in zip(rows, prefilled, together, strict=True):
        alone = row_scores(r.completion_tokens, r.seed, p.blocks(), 1.0, 0.9, TOLERANCES["float32"])
        for mine, theirs in zip((scored.gap, scored.runner_up, scored.logprob), (alone.gap, alone.runner_up, alone.logprob)):
            assert mine.shape == (len(r.completion_tokens),) and torch.allclose(mine, theirs, atol=1e-6)
