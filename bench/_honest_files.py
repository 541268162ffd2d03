"""Honest files made by the node's code and checked by a validator's, in one process: what each half costs."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.environments.registry import get_environment
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.rollout_file import read_rollouts
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.validator.checks import CheckSettings, Context, validate


@dataclass
class Costs:
    generate_s: float
    """Seconds generating (the backend's part of the node's work)."""
    node_s: float
    """Seconds of the node's whole work: generating, then rewards, proofs and the file."""
    generated: int
    """Completion tokens generated."""
    check_s: float
    """Seconds of the validator's every check of every file (one batched prefill of 64 rows at most)."""


def made_and_checked(tasks: list[TaskSpec], model: str, environment: str) -> Costs:
    """``tasks[0]`` only loads the model; the rest are made into files, then each file is checked by a validator
    holding ``model`` in fp32. Every file must pass: a rejected honest file is a bug, not a figure."""
    finish(generate(tasks[0]))
    files, generate_s, node_s, generated = [], 0.0, 0.0, 0
    for task in tasks[1:]:
        started = time.perf_counter()
        produced = generate(task)
        files.append((task, finish(produced).data))
        node_s += time.perf_counter() - started
        generate_s += produced.generate_s
        generated += sum(len(c.tokens) for c in produced.completions)
    loaded, tokenizer = load_model(model)
    plugin = get_environment(environment)
    problems = {p.id: p for p in plugin.problems()}
    started = time.perf_counter()
    for task, data in files:
        context = Context(task, hashlib.sha256(data).hexdigest(), 0, 0, loaded, tokenizer, plugin, problems)
        verdict = validate(data, context, CheckSettings(prefill_batch=64))
        assert verdict.accepted, verdict.reason
        assert sum(len(r.completion_tokens) for r in read_rollouts(data)) > 0
    return Costs(generate_s, node_s, generated, time.perf_counter() - started)
