"""Rewards on fixed cases: arithmetic, math formatting variants, the code sandbox against
hostile code, the thinking budget, and dataset files."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from intellect_protocol.shared.environments import arithmetic
from intellect_protocol.shared.environments.builtin import Arithmetic, Code
from intellect_protocol.shared.environments.code import UnsupportedTest, parse_test
from intellect_protocol.shared.environments.code import reward as code_reward
from intellect_protocol.shared.environments.datasets import DatasetError, load_rows
from intellect_protocol.shared.environments.length import LengthBudget, length_penalty, with_target, within_budget
from intellect_protocol.shared.environments.long_sum import LongSum
from intellect_protocol.shared.environments.math import MathVerifier
from intellect_protocol.shared.environments.registry import Problem, get_environment, reward
from intellect_protocol.shared.environments.sandbox import (
    SANDBOX_UIDS,
    UID_LOCKS,
    Limits,
    SandboxUnavailable,
    confinement,
    run_python,
)
from intellect_protocol.shared.run_schemas import RUN_DEFAULTS, RunCreate, RunSpec

pytestmark = pytest.mark.unit

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def test_arithmetic_scratchpad_and_reward() -> None:
    assert arithmetic.scratchpad("347+285:") == "c1:7+5+0=12;c2:4+8+1=13;c3:3+2+1=06;=632"
    assert arithmetic.reward("c1:7+5+0=12;c2:4+8+1=13;c3:3+2+1=06;=632", 632) == 1.0
    assert arithmetic.reward("...;=633", 632) == 0.0
    assert arithmetic.reward("632", 632) == 0.0
    env = get_environment("arithmetic")
    assert len({p.id for p in env.problems()}) == len(env.problems())
    assert env.problems()[:3] == Arithmetic().problems()[:3]  # deterministic


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier(timeout_s=5)
    yield v
    v.close()


@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("So $x = \\boxed{\\frac{1}{2}}$.", "1/2", 1.0),
        ("The answer is \\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("\\boxed{ 84 }", "84", 1.0),
        ("The answer is \\boxed{83}", "84", 0.0),
        ("I am not sure.", "84", 0.0),
        ("\\boxed{__import__('os').system('touch /tmp/pwned')}", "0", 0.0),
    ],
)
def test_math_answers(verifier, completion: str, answer: str, expected: float) -> None:
    assert verifier.reward(completion, answer) == expected
    assert not os.path.exists("/tmp/pwned")


def test_math_check_time_is_bounded() -> None:
    verifier = MathVerifier(timeout_s=1)
    try:
        verifier.reward("\\boxed{1}", "1")  # start the worker outside the measurement
        start = time.monotonic()
        assert verifier.reward("\\boxed{9^{9^{9^{9^{9^{9}}}}}}", "1") == 0.0
        assert time.monotonic() - start < 5
        assert verifier.reward("\\boxed{1}", "1") == 1.0  # a fresh worker after the kill
    finally:
        verifier.close()


def test_code_scores_fraction_of_tests() -> None:
    good = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```"
    assert code_reward(good, ADD_TESTS) == 1.0
    assert code_reward("```python\ndef add(a, b):\n    return 3\n```", ADD_TESTS) == pytest.approx(1 / 3)
    assert code_reward("def add(a, b): return a + b", ADD_TESTS) == 1.0  # no fence: the whole text
    assert code_reward("this is not code", ADD_TESTS) == 0.0
    assert code_reward(good, []) == 0.0


@pytest.mark.parametrize(
    "hostile",
    [
        "def add(a, b):\n    while True:\n        pass",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "print('x' * 10**8)\ndef add(a, b): return a + b",
        "import os, sys\nos._exit(0)",
        "import sys\nprint('ok')\nsys.exit(0)",
        "x = bytearray(4 * 1024**3)",
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\ndef add(a, b): return a + b",
    ],
)
def test_hostile_code_scores_zero_within_the_limit(hostile: str) -> None:
    start = time.monotonic()
    assert code_reward(f"```python\n{hostile}\n```", ADD_TESTS[:1], Limits(wall_s=2, cpu_s=2)) == 0.0
    assert time.monotonic() - start < 10


INTROSPECTION = """\
import sys
frame = sys._getframe()
while frame is not None:  # every name in every frame above the solution, the harness's included
    for value in list(frame.f_globals.values()) + list(frame.f_locals.values()):
        if isinstance(value, str) and len(value) == 32:
            print("\\n" + value)
    frame = frame.f_back
sys.stdout.flush()
import os
os._exit(0)
"""


@pytest.mark.parametrize(
    "forgery",
    [
        INTROSPECTION,  # passed every test under the old harness, which kept its pass marker in reach
        "import sys\nprint(sys.stdin.read() if not sys.stdin.closed else '')\nprint('\\n3')",
        "import os\nprint('\\n3', flush=True)\nos._exit(0)",  # a constant, then out before the probe runs
        "import builtins\nbuiltins.repr = lambda v: '3'\ndef add(a, b): return 0",  # hooks the harness's repr
    ],
)
def test_code_cannot_forge_a_pass_from_inside_the_sandbox(forgery: str) -> None:
    assert code_reward(f"```python\n{forgery}\n```", ADD_TESTS) < 1.0
    assert code_reward(f"```python\n{forgery}\n```", ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]) < 1.0


def test_a_fork_bomb_cannot_starve_the_sandboxes_beside_it() -> None:
    """Process limits bind per user, so each sandbox has a user of its own: honest code scores
    full marks while a fork bomb holds its own limit to the brim, and none of it outlives its run."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    honest = "```python\nimport subprocess\nsubprocess.run(['true'])\ndef add(a, b): return a + b\n```"
    with ThreadPoolExecutor(4) as pool:
        bombs = [pool.submit(code_reward, f"```python\n{bomb}\n```", ADD_TESTS[:1], Limits(wall_s=4, cpu_s=4)) for _ in range(2)]
        time.sleep(0.5)  # the bombs are at their limits
        assert [code_reward(honest, ADD_TESTS[:1]) for _ in range(3)] == [1.0, 1.0, 1.0]
        assert [b.result() for b in bombs] == [0.0, 0.0]
    if os.geteuid() == 0:
        deadline = time.monotonic() + 2  # SIGKILL is delivered, not awaited
        while _live_sandbox_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _live_sandbox_processes() == []


def _live_sandbox_processes() -> list[str]:
    """Live processes under a sandbox user id that no sandbox holds (another test's running sandbox holds its id)."""
    live = []
    for proc in Path("/proc").iterdir():
        try:
            uid = proc.stat().st_uid
            if proc.name.isdigit() and uid in SANDBOX_UIDS and "\tZ" not in (proc / "status").read_text() and _released(uid):
                live.append(proc.name)
        except FileNotFoundError:
            pass
    return live


def _released(uid: int) -> bool:
    fd = os.open(UID_LOCKS / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_tests_are_judged_outside_the_sandbox() -> None:
    assert parse_test("assert add(1, 2) == 3").probe == "add(1, 2)"
    assert parse_test("assert 10**12 + 1 == add(10**12, 1)").passes(10**12 + 1)
    assert parse_test("assert not is_palindrome('python')").passes(False)
    assert parse_test("assert second_largest([2]) is None").passes(None)
    assert not parse_test("assert second_largest([2]) is None").passes(0)
    assert parse_test("assert f(3) in [1, 2, 3]").passes(3)
    for unsupported in (
        "assert f(1) == f(2)",
        "x = 1",
        "assert f(1), 'message'",
        "assert f(1)\nassert f(2)",
        "assert f(1) == 2 ** 99999",
    ):
        with pytest.raises(UnsupportedTest):
            parse_test(unsupported)


def test_code_cannot_touch_files_outside_its_dir(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.chmod(tmp_path, 0o777)
    os.chmod(victim, 0o666)  # even a world-writable file outside the sandbox stays intact
    attack = f"import os, shutil\nfor p in ({str(victim)!r}, {str(tmp_path)!r}, '/etc/hostname'):\n    try:\n        os.remove(p) if p.endswith(('.txt', 'hostname')) else shutil.rmtree(p)\n    except Exception:\n        pass\ndef add(a, b): return a + b"
    assert code_reward(f"```python\n{attack}\n```", ADD_TESTS[:1]) == 1.0
    assert victim.read_text() == "keep"
    assert Path("/etc/hostname").exists()


def test_code_reaches_no_network_even_on_loopback() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(3)
    port = listener.getsockname()[1]
    leak = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'secret')\nprint('sent')"
    with ThreadPoolExecutor(1) as pool:
        accepted = pool.submit(listener.accept)
        result = run_python({"leak.py": leak}, "leak.py")
        with pytest.raises(TimeoutError):
            accepted.result()
    listener.close()
    assert "sent" not in result.stdout and result.returncode != 0, result.stdout


FLOOD = """\
import os
written = 0
for where in (".", "/tmp"):
    for i in range(400):
        try:
            with open(os.path.join(where, f"f{i}"), "wb") as f:
                f.write(b"x" * 60_000)
            written += 60_000
        except OSError:
            break
print(written)
"""


def test_what_code_writes_stays_in_its_private_capped_directory() -> None:
    before = {p.name for p in Path(tempfile.gettempdir()).iterdir()}
    result = run_python({"flood.py": FLOOD}, "flood.py", limits=Limits(scratch_bytes=4 << 20))
    assert result.returncode == 0, result.stdout
    assert 0 < int(result.stdout.split()[-1]) <= 4 << 20  # 48 MB asked for, 4 MiB allowed
    assert not any(
        name.startswith("f") and name[1:].isdigit() for name in {p.name for p in Path(tempfile.gettempdir()).iterdir()} - before
    )


def test_without_bubblewrap_the_code_environment_refuses_with_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    confinement.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="only inside bubblewrap .* apt-get install bubblewrap"):
            Code()
        with pytest.raises(SandboxUnavailable):
            code_reward("```python\ndef add(a, b): return a + b\n```", ADD_TESTS[:1])
    finally:
        confinement.cache_clear()


def test_length_budget() -> None:
    budget = LengthBudget(alpha=0.001, target_tokens=100)
    assert length_penalty(100, budget) == 0
    assert length_penalty(150, budget) == pytest.approx(0.05)
    assert length_penalty(50, budget) == pytest.approx(0.05)
    over = budget.model_copy(update={"over_only": True})
    assert length_penalty(50, over) == 0 and length_penalty(150, over) == pytest.approx(0.05)
    assert reward(1.0, 150, budget) == (pytest.approx(0.95), pytest.approx(0.05))
    assert "100 tokens" in with_target("Solve x.", budget, Arithmetic(count=1))
    assert with_target("Solve x.", budget.model_copy(update={"alpha": 0.0}), Arithmetic(count=1)) == "Solve x."
    assert within_budget(125, budget) and within_budget(75, budget) and not within_budget(126, budget)
    assert within_budget(10, over) and not within_budget(126, over)
    assert with_target("a7b2:", budget, LongSum(count=1)) == "100|a7b2:"  # in the environment's own characters
    # A run asks for a ceiling as it asks for a target; what it leaves out keeps the default.
    made = RunSpec.of(RunCreate(name="r", length_alpha=0.001, length_over_only=True)).length_budget
    assert made == LengthBudget(alpha=0.001, target_tokens=RUN_DEFAULTS.length_budget.target_tokens, over_only=True)
    assert not RunSpec.of(RunCreate(name="r", length_alpha=0.001)).length_budget.over_only


def test_datasets_load_and_refuse_bad_files(tmp_path: Path) -> None:
    assert len(get_environment("math").problems()) == 10
    assert all(p.tests for p in get_environment("code").problems())
    rows = [{"id": 1, "prompt": "1+1:", "answer": "2"}, {"id": 2, "prompt": "2+2:", "answer": "4"}]
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    assert Arithmetic(jsonl).problems() == Arithmetic(parquet).problems()
    assert Arithmetic(jsonl).problems()[0] == Problem(id="1", prompt="1+1:", answer="2")

    for content, message in (
        ("{bad json", "not JSON"),
        (json.dumps({"id": 1}), "lacks prompt"),
        ("\n".join([json.dumps(rows[0])] * 2), "repeats id"),
    ):
        jsonl.write_text(content)
        with pytest.raises(DatasetError, match=message):
            load_rows(jsonl, ("prompt", "answer"))
    with pytest.raises(DatasetError, match="jsonl or .parquet"):
        load_rows(tmp_path / "a.csv", ("prompt",))
