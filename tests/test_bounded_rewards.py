"""A plugin's reward that raises, hangs, allocates without end or returns no number is a :class:`PluginFailure`
naming the plugin, the problem and what went wrong, never an exception of its own or a hang of the caller."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from intellect_protocol.shared.environments.bounded import BoundedRewards, PluginFailure, RewardLimits
from intellect_protocol.shared.environments.registry import plugin
from tests.helpers import install_distribution

pytestmark = pytest.mark.unit

BUGGY = """
import os
import time

from intellect_protocol.shared.environments.registry import Problem

time.sleep(float(os.environ.get("BUGGY_IMPORT_S", "0")))  # a plugin slow to load (or a loaded machine)
if os.environ.get("BUGGY_IMPORT_EXIT"):
    raise SystemExit(int(os.environ["BUGGY_IMPORT_EXIT"]))  # past the loader's `except Exception`

class Buggy:
    name = "buggy"

    def problems(self):
        return [Problem(id=f"b{i}", prompt=f"{i}:", answer=str(i)) for i in range(8)]

    def task_reward(self, completion, problem):
        if completion == "raise":
            return {}["answer"]
        if completion == "hang":
            while True:
                pass
        if completion == "hog":
            hoard = []
            while True:  # address space the bound counts, left untouched (calloc'd): no page is written, on any load
                hoard.append(bytes(64 << 20))
        if completion == "exit":
            os._exit(9)
        if completion == "text":
            return "yes"
        if completion == "nan":
            return float("nan")
        return float(completion == problem.answer)

    def reply(self, problem, seed, turns):
        if turns[-1] == "loop":
            while True:
                pass
        if turns[-1] == "hog":
            return self.task_reward("hog", problem)
        if turns[-1] == "number":
            return 7
        return f"{problem.id}/{seed}/{len(turns)}" if turns[-1] != "done" else None

    def call(self, problem, seed, name, arguments):
        if name == "number":
            return 7
        return f"{problem.id}/{seed}/{name}/{arguments['x']}"
"""


def bounded_buggy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_bytes: int) -> BoundedRewards:
    install_distribution(tmp_path, "intellect-hangs", "0.3.0", {"buggy": "intellect_hangs:Buggy"}, BUGGY)
    monkeypatch.syspath_prepend(str(tmp_path))  # the reward process starts with this process's path
    return BoundedRewards("buggy", plugin("buggy").pin, RewardLimits(timeout_s=3, memory_bytes=memory_bytes))


@pytest.fixture
def buggy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BoundedRewards:
    rewards = bounded_buggy(tmp_path, monkeypatch, 1 << 30)
    yield rewards
    rewards.close()


def test_each_way_a_reward_fails_is_one_sentence_and_the_next_call_works(buggy: BoundedRewards) -> None:
    from intellect_protocol.shared.environments.registry import Problem

    problem = Problem(id="b3", prompt="3:", answer="3")
    buggy.start()  # as a benchmark starts it before its clock: the first call then finds it running
    started_child = buggy._child
    assert started_child is not None and started_child.is_alive()
    assert buggy.task_reward("3", problem) == 1.0 and buggy.task_reward("4", problem) == 0.0
    assert buggy._child is started_child
    expected = {
        "raise": "raised KeyError: 'answer'",
        "text": "returned 'yes', not a finite number",
        "nan": "returned nan, not a finite number",
        "hang": "did not return within 3 s",
        "exit": "ended the reward process (exit code 9; out of memory?)",
        "hog": "raised MemoryError (past the 1024 MiB it may add)",
    }
    for completion, what in expected.items():
        started = time.monotonic()
        with pytest.raises(PluginFailure) as failed:
            buggy.task_reward(completion, problem)
        assert str(failed.value) == (f"environment 'buggy' (intellect-hangs==0.3.0) failed on problem 'b3': its reward {what}"), (
            completion
        )
        assert (failed.value.problem_id, failed.value.completion) == ("b3", completion)
        assert time.monotonic() - started < 30
        assert buggy.task_reward("3", problem) == 1.0  # a hung or dead reward process is replaced


def test_a_reward_process_slow_to_start_spends_none_of_a_rewards_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the plugin takes longer than one reward may (a loaded machine, a heavy import): the call still scores,
    since its time counts from the process being ready; past ``start_timeout_s`` the call fails in one sentence."""
    from intellect_protocol.shared.environments.registry import Problem

    monkeypatch.setenv("BUGGY_IMPORT_S", "4")
    rewards = bounded_buggy(tmp_path, monkeypatch, 1 << 30)  # 3 s a reward
    problem = Problem(id="b3", prompt="3:", answer="3")
    try:
        assert rewards.task_reward("3", problem) == 1.0
    finally:
        rewards.close()
    impatient = BoundedRewards("buggy", plugin("buggy").pin, RewardLimits(timeout_s=3, start_timeout_s=1))
    with pytest.raises(PluginFailure) as failed:
        impatient.task_reward("3", problem)
    assert str(failed.value) == (
        "environment 'buggy' (intellect-hangs==0.3.0) failed on problem 'b3': its reward could not start: "
        "the process loading it took over 1 s"
    )
    assert impatient._child is None  # killed: the next call starts afresh
    with pytest.raises(RuntimeError, match=r"^environment 'buggy' \(intellect-hangs==0.3.0\): its reward could not start"):
        impatient.start()
    monkeypatch.setenv("BUGGY_IMPORT_S", "0")
    monkeypatch.setenv("BUGGY_IMPORT_EXIT", "3")
    with pytest.raises(PluginFailure, match=r"its reward could not start: the process loading it ended \(exit code 3\)$"):
        impatient.task_reward("3", problem)


def test_the_memory_bound_counts_from_what_the_reward_process_holds_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child already holds the interpreter and the caller's main module when it starts (on a CUDA machine, torch:
    several GiB); a bound smaller than that must still leave the plugin its allowance, not fail every reward."""
    from intellect_protocol.shared.environments.registry import Problem

    rewards = bounded_buggy(tmp_path, monkeypatch, 32 << 20)  # less than a Python process with pydantic holds
    try:
        problem = Problem(id="b3", prompt="3:", answer="3")
        assert rewards.task_reward("3", problem) == 1.0
        with pytest.raises(PluginFailure, match=r"raised MemoryError \(past the 32 MiB it may add\)"):
            rewards.task_reward("hog", problem)
    finally:
        rewards.close()


def test_a_reply_that_loops_allocates_or_is_no_text_is_one_sentence_and_the_next_works(buggy: BoundedRewards) -> None:
    """A multi-turn environment's reply runs bounded as its reward does: a tool call that loops or allocates without
    end gives the same sentence on every machine, and stalls nobody past the bound."""
    from intellect_protocol.shared.environments.registry import Problem

    problem = Problem(id="b3", prompt="3:", answer="3")
    assert buggy.reply(problem, 11, ["a", "fine"]) == "b3/11/2" and buggy.reply(problem, 11, ["done"]) is None
    expected = {
        "loop": "did not return within 3 s",
        "hog": "raised MemoryError (past the 1024 MiB it may add)",
        "number": "returned 7, not text or None",
    }
    for turn, what in expected.items():
        with pytest.raises(PluginFailure) as failed:
            buggy.reply(problem, 11, [turn])
        assert str(failed.value) == f"environment 'buggy' (intellect-hangs==0.3.0) failed on problem 'b3': its reply {what}", turn
        assert buggy.reply(problem, 12, ["fine"]) == "b3/12/1"


def test_a_tool_call_runs_bounded_and_a_result_that_is_no_text_is_one_sentence(buggy: BoundedRewards) -> None:
    from intellect_protocol.shared.environments.registry import Problem

    problem = Problem(id="b3", prompt="3:", answer="3")
    assert buggy.call(problem, 11, "calc", {"x": 2}) == "b3/11/calc/2"
    for name, arguments, what in (("number", {}, "returned 7, not text"), ("calc", {}, "raised KeyError: 'x'")):
        with pytest.raises(PluginFailure) as failed:
            buggy.call(problem, 11, name, arguments)
        assert str(failed.value) == f"environment 'buggy' (intellect-hangs==0.3.0) failed on problem 'b3': its call {what}"
    assert buggy.call(problem, 12, "calc", {"x": 5}) == "b3/12/calc/5"


def test_one_exchange_answers_each_item_and_stops_at_the_first_failure(buggy: BoundedRewards) -> None:
    """Rewards and replies go to the child in one message; its answers come back one by one, so a failure names its
    own problem, and nothing of the rest of that exchange is left to be read as the next call's answer."""
    from intellect_protocol.shared.environments.registry import Problem

    problems = [Problem(id=f"b{i}", prompt=f"{i}:", answer=str(i)) for i in range(3)]
    assert buggy.task_rewards([("0", problems[0]), ("5", problems[1]), ("2", problems[2])]) == [1.0, 0.0, 1.0]
    with pytest.raises(PluginFailure) as failed:
        buggy.task_rewards([("0", problems[0]), ("raise", problems[1]), ("2", problems[2])])
    assert "failed on problem 'b1': its reward raised KeyError" in str(failed.value)
    assert buggy.replies([(problems[2], 4, ["a"]), (problems[0], 5, ["a", "b"])]) == ["b2/4/1", "b0/5/2"]


def test_a_failure_crosses_processes_whole() -> None:
    import pickle

    failure = PluginFailure("environment 'x' (x==1) failed on problem 'p': its reward raised KeyError: 'a'", "p", "text")
    again = pickle.loads(pickle.dumps(failure))
    assert (str(again), again.problem_id, again.completion) == (str(failure), "p", "text")
