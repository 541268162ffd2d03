"""Multi-turn episodes end to end on the shipped model: the node runs them (its turns end at the environment's stop,
the environment's replies are appended, the seeded draw goes on), the validator replays them and accepts honest
work, and every way of lying about who wrote which token is refused hard, with its reason."""

from __future__ import annotations

import hashlib
import io
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from eth_account import Account
from rich.console import Console

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node import work
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.environments.bounded import PluginFailure
from intellect_protocol.shared.environments.registry import Environment, Problem, get_environment, plugin
from intellect_protocol.shared.environments.turns import rules_of
from intellect_protocol.shared.episodes import Replies
from intellect_protocol.shared.inference import prefill_batch
from intellect_protocol.shared.rollout_file import Rollout, read_rollouts, write_rollouts
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import SamplingParams, TaskSpec
from intellect_protocol.shared.toploc import rollout_passes, verify_proofs_batch
from intellect_protocol.trainer.data import fetch_accepted
from intellect_protocol.validator.checks import Context, validate
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import HTTP, make_run
from tests.support.adversary import tiny
from tests.support.checks import failed, make_task
from tests.support.echo import check, echo_environment, echo_task, rules_limits
from tests.support.protocol import grant, joined, lease, upload

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    with echo_environment(tmp_path_factory.mktemp("site")) as found:
        yield found


@pytest.fixture(scope="module")
def episodes(echo: Environment) -> tuple[TaskSpec, bytes]:
    task = echo_task(4_000)
    return task, finish(generate(task)).data


def test_the_node_runs_episodes_and_the_validator_replays_them(episodes: tuple[TaskSpec, bytes], echo: Environment) -> None:
    task, data = episodes
    rows = read_rollouts(data, rules_limits(echo, task))
    replied = [r for r in rows if r.sampled is not None and not all(r.sampled)]
    assert len(replied) >= 8, [r.sampled for r in rows]  # the model writes ";" in most rows: the environment answers
    _, tokenizer = tiny()
    for r in replied:
        text = tokenizer.decode(r.completion_tokens)
        written = [t for t, s in zip(r.completion_tokens, r.sampled or []) if not s]
        assert set(tokenizer.decode(written)) == {"c"} and ";c" in text
        assert all(lp == 0.0 for lp, s in zip(r.logprobs, r.sampled or []) if not s)
        assert 1 <= r.environment_turns() <= 2
    # The proofs cover the whole episode, the environment's tokens included: one prefill reproduces them.
    model, _ = tiny()
    prefilled = prefill_batch(model, [r.prompt_tokens for r in replied], [r.completion_tokens for r in replied])
    assert all(rollout_passes(c) for c in verify_proofs_batch([p.hidden for p in prefilled], [r.proofs for r in replied]))
    verdict = check(data, task, echo)
    assert verdict.accepted, verdict.reason


def first_reply(r: Rollout) -> int:
    """Position of the row's first environment token."""
    return (r.sampled or []).index(False)


def forge(data: bytes, task: TaskSpec, environment: Environment, change: Callable[[Rollout], None]) -> bytes:
    rows = read_rollouts(data, rules_limits(environment, task))
    change(next(r for r in rows if r.sampled is not None and not all(r.sampled)))
    return write_rollouts(rows)


def forged_tool_output(r: Rollout) -> None:
    r.completion_tokens[first_reply(r)] = tiny()[1].convert_tokens_to_ids("7")


def sampled_labelled_as_the_environments(r: Rollout) -> None:
    assert r.sampled is not None
    at = first_reply(r) - 1  # the ";" the model drew, now said to be the environment's
    r.sampled[at], r.logprobs[at] = False, 0.0


def environments_labelled_as_sampled(r: Rollout) -> None:
    assert r.sampled is not None
    at = first_reply(r)
    r.sampled[at], r.logprobs[at] = True, -0.5


def longer_tool_output(r: Rollout) -> None:
    assert r.sampled is not None
    at = first_reply(r)
    r.completion_tokens.insert(at, r.completion_tokens[at])
    r.logprobs.insert(at, 0.0)
    r.sampled.insert(at, False)
    for extra in (r.completion_tokens, r.logprobs, r.sampled):
        del extra[-2]  # the row keeps its length and its last token


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (forged_tool_output, "is not what the environment gives"),
        (sampled_labelled_as_the_environments, "without EOS, a tool call or the token limit"),
        (environments_labelled_as_sampled, "some labelled as sampled"),
        (longer_tool_output, "is not what the environment gives"),
    ],
)
def test_lies_about_who_wrote_a_token_are_refused_hard(
    episodes: tuple[TaskSpec, bytes], echo: Environment, change: Callable[[Rollout], None], reason: str
) -> None:
    task, data = episodes
    verdict = check(forge(data, task, echo, change), task, echo)
    assert not verdict.accepted and verdict.hard, verdict.reason
    assert reason in failed(verdict).get("sampling", ""), failed(verdict)


def test_more_environment_turns_than_the_environment_allows_are_refused(
    episodes: tuple[TaskSpec, bytes], echo: Environment
) -> None:
    task, data = episodes

    def three_turns(r: Rollout) -> None:
        r.sampled = [at not in (1, 3, 5) for at in range(len(r.completion_tokens))]  # three one-token replies
        r.logprobs = [0.0 if not s else min(lp, -0.5) for lp, s in zip(r.logprobs, r.sampled)]

    verdict = check(forge(data, task, echo, three_turns), task, echo)
    assert not verdict.accepted and verdict.hard
    assert "environment turns; this run allows at most 2" in failed(verdict)["integrity"]


def test_an_episode_drawn_under_another_seed_is_refused(episodes: tuple[TaskSpec, bytes], echo: Environment) -> None:
    # Both halves of the episode hang on the seed: the model's draws, and here the environment's replies too.
    task, data = episodes
    drawn = read_rollouts(finish(generate(task.model_copy(update={"seed": task.seed + 7}))).data, rules_limits(echo, task))
    for r, assigned in zip(drawn, read_rollouts(data, rules_limits(echo, task)), strict=True):
        r.task_id, r.seed = assigned.task_id, assigned.seed
    verdict = check(write_rollouts(drawn), task, echo)
    assert not verdict.accepted and verdict.hard, verdict.reason


class NextVersion:
    """intellect-echo 0.2.0 as a node might run it against a run that pins 0.1.0: the same stops, "c" and "cc" swapped."""

    def __init__(self, pinned: Replies) -> None:
        self.pinned = pinned

    def reply(self, problem: Problem, seed: int, turns: list[str]) -> str:  # noqa: ARG002
        return "c" * (2 - (seed + len(turns)) % 2)

    def task_reward(self, text: str, problem: Problem) -> float:
        return self.pinned.task_reward(text, problem)  # type: ignore[attr-defined]


def test_an_episode_run_under_another_plugin_version_is_refused(echo: Environment, monkeypatch: pytest.MonkeyPatch) -> None:
    base = make_task(4_002, prompts=2, samples=4, temperature=1.0, max_tokens=48)
    task = base.model_copy(update={"environment": "echo", "environment_version": plugin("echo").pin})
    pinned = work.rewards_for(task.environment, task.environment_version)
    monkeypatch.setattr(work, "rewards_for", lambda *_: NextVersion(pinned))
    data = finish(generate(task)).data
    assert any(r.sampled is not None and not all(r.sampled) for r in read_rollouts(data, rules_limits(echo, task)))
    verdict = check(data, task, echo)
    assert not verdict.accepted and verdict.hard, verdict.reason
    assert "is not what the environment gives" in failed(verdict).get("sampling", ""), failed(verdict)


def test_a_thinking_budget_counts_the_models_tokens_not_the_environments(echo: Environment) -> None:
    base = make_task(4_001, prompts=2, samples=4, temperature=1.0, max_tokens=48)
    update = {"environment": "echo", "environment_version": plugin("echo").pin, "length_alpha": 0.01, "target_length": 20}
    task = base.model_copy(update=update)
    data = finish(generate(task)).data
    rows = read_rollouts(data, rules_limits(echo, task))
    assert any(r.sampled is not None and not all(r.sampled) for r in rows)
    for r in rows:
        sampled = len(r.completion_tokens) if r.sampled is None else sum(r.sampled)
        assert r.length_penalty == pytest.approx(0.01 * abs(sampled - 20)), (r.sampled, r.length_penalty)
    assert check(data, task, echo).accepted
    # A node that counts the environment's tokens against the model is refused by the reward check.
    counted = forge(data, task, echo, lambda r: _penalise_every_token(r, 0.01, 20))
    verdict = check(counted, task, echo)
    assert not verdict.accepted and "length_penalty" in failed(verdict).get("rewards", ""), failed(verdict)


def _penalise_every_token(r: Rollout, alpha: float, target: int) -> None:
    r.length_penalty = alpha * abs(len(r.completion_tokens) - target)
    r.reward = r.task_reward - r.length_penalty


def test_an_episode_goes_from_node_to_trainer_through_the_network(echo: Environment, sqlite_url: str, tmp_path: Path) -> None:
    """Real coordinator, real validator, real HTTP: the upload is read within the environment's bounds, the
    validator's replay accepts it, and the trainer reads who wrote each token."""
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        run_id = make_run(
            served,
            environment="echo",
            sampling=SamplingParams(max_tokens=48),
            samples=4,
            audit=AuditPolicy(share=0, new_node_share=0, suspect_share=0),
        )
        validator, trainer = Account.create(), Account.create()
        grant(served, admin_token(served), validator.address, "validator")
        grant(served, admin_token(served), trainer.address, "trainer")
        node = joined(served)
        task = lease(served, node)
        submission = upload(served, node, task, finish(generate(task)).data)
        checker = Validator(served.url, validator, tmp_path / "validator", Console(file=io.StringIO()))
        try:
            assert checker.run(max_submissions=1) == 1
        finally:
            checker.close()
        receipt = HTTP.get(f"{served.url}/v1/public/submissions/{submission}").json()
        assert receipt["status"] == "accepted", receipt
        with CoordinatorClient(served.url, trainer) as api:
            [(_, rows)] = fetch_accepted(api, run_id, 0, 0)
        assert rows is not None and any(r.sampled is not None and not all(r.sampled) for r in rows)


def test_an_environment_whose_reply_is_not_a_function_of_the_turns_is_refused_by_name(
    episodes: tuple[TaskSpec, bytes], echo: Environment
) -> None:
    """A plugin that answers the same turns differently (a clock, a random draw of its own) cannot be replayed: the
    validator finds it on the file's first row and says so, naming it, as a plugin failure: no verdict on the node."""
    task, data = episodes
    calls = itertools.count()

    class Drifting:
        name = "echo"
        requirement = "intellect-echo==0.1.0"

        def reply(self, problem: Problem, seed: int, turns: list[str]) -> str:  # noqa: ARG002
            return "c" * (1 + next(calls) % 2)

    problems = {p.id: p for p in echo.problems()}
    rules = rules_of(echo, task.sampling.max_tokens)
    ctx = Context(task, hashlib.sha256(data).hexdigest(), 0, 0, *tiny(), Drifting(), problems, rules)  # type: ignore[arg-type]
    with pytest.raises(
        PluginFailure,
        match=r"environment 'echo' \(intellect-echo==0\.1\.0\) failed on problem .*: its reply is not a function of the turns",
    ):
        validate(data, ctx)


def test_a_single_turn_run_refuses_a_file_with_the_environments_tokens(
    episodes: tuple[TaskSpec, bytes], echo: Environment
) -> None:
    task, data = episodes
    arithmetic = get_environment("arithmetic")
    single = task.model_copy(update={"environment": "arithmetic", "environment_version": plugin("arithmetic").pin})
    problems = {p.id: p for p in arithmetic.problems()}
    ctx = Context(single, hashlib.sha256(data).hexdigest(), 0, 0, *tiny(), arithmetic, problems)
    verdict = validate(data, ctx)
    assert not verdict.accepted and "this run allows at most 0" in failed(verdict)["integrity"]
