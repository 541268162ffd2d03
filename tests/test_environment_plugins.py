"""Environments as plugins: discovered through their entry-point group, pinned by each run to the
distribution, version and code hash the coordinator had, and refused, with a sentence saying what to
install, wherever that exact code is missing. The built-ins register the same way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, select

from intellect_protocol.coordinator.models import Run, Submission, Task
from intellect_protocol.devnet.processes import Process, admin_token, script, spawn, start_coordinator, start_node
from intellect_protocol.shared.environments.registry import EnvironmentUnavailable, get_environment, installed, plugin
from intellect_protocol.shared.states import SubmissionStatus
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from tests.helpers import HTTP, install_distribution, install_example_environment

ROOT = Path(__file__).resolve().parent.parent
OURS = plugin("arithmetic").pin
EXAMPLE = re.compile(r"intellect-column-credit==0\.1\.0 sha256=[0-9a-f]{16}")


PALINDROMES = """
from intellect_protocol.shared.environments.registry import Problem

class Palindromes:
    name = "palindromes"

    def problems(self):
        return [Problem(id=f"p{i}", prompt=f"{i}{i}:", answer=str(i)[::-1]) for i in range(100, 120)]

    def task_reward(self, completion, problem):
        return float(completion.strip() == problem.answer)

class Broken:
    def __init__(self):
        raise RuntimeError("its dataset is missing")

class Unlisted:
    name = "unlisted"

    def problems(self):
        return {}["rows"]

    def task_reward(self, completion, problem):
        return 0.0

class Duplicates:
    name = "duplicates"

    def problems(self):
        return [Problem(id="same", prompt="1+1:"), Problem(id="same", prompt="2+2:")]

    def task_reward(self, completion, problem):
        return 0.0
"""


@pytest.mark.unit
def test_the_builtins_are_plugins_of_this_distribution() -> None:
    assert re.fullmatch(r"intellect-protocol sha256=[0-9a-f]{16}", OURS), "built-ins are pinned by their code, not the version"
    plugins = installed()
    assert {name: found.pin for name, found in plugins.items() if found.package == "intellect-protocol"} == {
        "arithmetic": OURS,
        "math": OURS,
        "code": OURS,
        "calculator": OURS,
        "long-sum": OURS,
    }
    assert get_environment("arithmetic", OURS).problems()[0].prompt.endswith(":")


@pytest.mark.unit
def test_a_plugin_is_found_loaded_and_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = {
        "palindromes": "intellect_palindromes:Palindromes",
        "broken": "intellect_palindromes:Broken",
        "unlisted": "intellect_palindromes:Unlisted",
        "duplicates": "intellect_palindromes:Duplicates",
        "missing-module": "intellect_nowhere:Factory",
    }
    install_distribution(tmp_path, "intellect-palindromes", "2.1.0", entries, PALINDROMES)
    monkeypatch.syspath_prepend(str(tmp_path))

    found = plugin("palindromes")
    assert (found.package, found.version) == ("intellect-palindromes", "2.1.0")
    pin = found.pin
    assert re.fullmatch(r"intellect-palindromes==2\.1\.0 sha256=[0-9a-f]{16}", pin)
    environment = get_environment("palindromes", pin)
    problem = environment.problems()[3]
    assert environment.task_reward("301", problem) == 1.0 and environment.task_reward("103", problem) == 0.0

    with pytest.raises(
        EnvironmentUnavailable,
        match=r"is intellect-palindromes==2.1.0 sha256=[0-9a-f]{16} here but the run pins intellect-palindromes==2.0.0",
    ):
        get_environment("palindromes", "intellect-palindromes==2.0.0")
    # The same name and version with other reward code: refused by its hash.
    (tmp_path / "intellect_palindromes.py").write_text(PALINDROMES.replace("completion.strip() ==", "completion !="))
    with pytest.raises(EnvironmentUnavailable, match="its code here differs from the run's"):
        plugin("palindromes", pin)
    with pytest.raises(
        EnvironmentUnavailable, match=r"'poetry' is not installed \(the run pins poetry==1.0: pip install 'poetry==1.0'\)"
    ):
        get_environment("poetry", "poetry==1.0")
    with pytest.raises(EnvironmentUnavailable, match="installed: .*arithmetic.*palindromes"):
        plugin("poetry")
    with pytest.raises(EnvironmentUnavailable, match="failed to load: RuntimeError: its dataset is missing"):
        get_environment("broken")
    with pytest.raises(
        EnvironmentUnavailable, match=r"'unlisted' \(intellect-palindromes==2.1.0\) failed to list its problems: KeyError: 'rows'"
    ):
        get_environment("unlisted")
    with pytest.raises(EnvironmentUnavailable, match="failed to load: ModuleNotFoundError"):
        get_environment("missing-module")
    with pytest.raises(EnvironmentUnavailable, match="unique, non-empty ids"):
        get_environment("duplicates")


@pytest.mark.unit
def test_a_name_two_distributions_claim_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A package that registers "arithmetic" must not silently replace (or be replaced by) the built-in one.
    install_distribution(tmp_path, "arith-impostor", "1.0", {"arithmetic": "arith_impostor:Arithmetic"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        EnvironmentUnavailable,
        match="provided by both intellect-protocol==.* and arith-impostor==1.0|provided by both arith-impostor==1.0 and intellect-protocol==",
    ):
        installed()


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return install_example_environment(tmp_path_factory.mktemp("plugin"))


def _coordinator(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*script("intellect-coordinator"), *args], capture_output=True, text=True, env={**os.environ, **env})


@pytest.mark.integration
@pytest.mark.early  # the stage's longest test: started first, the rest runs beside it
@pytest.mark.timeout(240)
def test_a_run_pins_the_installed_plugin_and_roles_without_it_stop_and_say_what_to_install(
    tmp_path: Path, sqlite_url: str, example: dict[str, str]
) -> None:
    listed = _coordinator(["run", "environments"], example)
    assert any(EXAMPLE.fullmatch(line.removeprefix("column-credit\t")) for line in listed.stdout.splitlines()), listed.stdout

    refused = _coordinator(["run", "create", "--name", "cc", "--environment", "column-credit", "--database-url", sqlite_url], {})
    assert refused.returncode == 2 and "Unusable environment: environment 'column-credit' is not installed" in refused.stderr

    small = ["--prompts-per-task", "2", "--samples-per-prompt", "2", "--max-tokens", "16"]  # one quick task is all it takes
    created = _coordinator(
        ["run", "create", "--name", "cc", "--environment", "column-credit", "--database-url", sqlite_url, *small], example
    )
    assert created.returncode == 0, created.stderr
    engine = create_engine(sqlite_url)
    with engine.connect() as connection:
        environment, pin = connection.execute(select(Run.environment, Run.environment_version)).one()
    assert environment == "column-credit" and EXAMPLE.fullmatch(pin), pin

    coordinator = start_coordinator(tmp_path, sqlite_url, env={"INTELLECT_BLOB_DIR": str(tmp_path / "blobs"), **example})
    address = create_wallet(tmp_path / "validator.json", "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    HTTP.post(
        f"{coordinator.url}/v1/admin/roles",
        json={"address": address, "role": "validator"},
        headers={"authorization": f"Bearer {admin_token(sqlite_url)}"},
    ).raise_for_status()
    for name in ("node", "equipped"):
        create_wallet(tmp_path / f"{name}.json", "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    # Side by side: a node without the plugin, one with it, and a validator without it, which must not judge the
    # equipped node's work by other reward code.
    node = start_node(tmp_path, "node", tmp_path / "node.json", coordinator.url, "pw")
    equipped = start_node(tmp_path, "equipped", tmp_path / "equipped.json", coordinator.url, "pw", env=example)
    validator = _validator(tmp_path, "validator", coordinator.url, {})
    # A validator with the same plugin name and version but another reward: it must not judge either.
    tampered = _tampered(example, tmp_path / "tampered")
    liar = create_wallet(tmp_path / "tampered.json", "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    HTTP.post(
        f"{coordinator.url}/v1/admin/roles",
        json={"address": liar, "role": "validator"},
        headers={"authorization": f"Bearer {admin_token(sqlite_url)}"},
    ).raise_for_status()
    other = _validator(tmp_path, "tampered", coordinator.url, tampered)
    try:
        assert node.popen.wait(timeout=120) == 7, node.tail()
        assert "not installed (the run pins intellect-column-credit==0.1.0 sha256=" in _words(node.tail())
        assert "pip install 'intellect-column-credit==0.1.0')" in _words(node.tail())
        assert validator.popen.wait(timeout=180) == 7, validator.tail() + equipped.tail()
        assert "This validator cannot judge a run's work: environment 'column-credit' is not installed" in _words(
            validator.tail()
        )
        assert other.popen.wait(timeout=180) == 7, other.tail()
        assert "its code here differs from the run's" in _words(other.tail())
        assert equipped.popen.poll() is None, equipped.tail()
        # The equipped node's work waits for a validator that has the plugin: no verdict was posted.
        assert set(_statuses(engine)) == {SubmissionStatus.pending}
        with engine.connect() as connection:  # the coordinator drew every task's prompts from the plugin's own dataset
            prompt_ids = [pid for ids in connection.execute(select(Task.prompt_ids)).scalars() for pid in ids["ids"]]
        assert prompt_ids and all(pid.startswith("cc") for pid in prompt_ids)
    finally:
        for process in (node, equipped, validator, other):
            process.stop()
        coordinator.stop()
        engine.dispose()


def _validator(tmp_path: Path, name: str, url: str, env: dict[str, str]) -> Process:
    command = [*script("intellect-validator"), "run", "--wallet", str(tmp_path / f"{name}.json")]
    command += ["--coordinator", url, "--state-dir", str(tmp_path / "state" / name)]
    return spawn(name, command, tmp_path / "logs" / f"{name}.log", {"INTELLECT_WALLET_PASSWORD": "pw", **env})


def _tampered(example: dict[str, str], where: Path) -> dict[str, str]:
    """A copy of the installed example plugin, same name and version, whose reward gives full credit to anything."""
    (site,) = [Path(p) for p in example["PYTHONPATH"].split(os.pathsep) if (Path(p) / "intellect_column_credit").is_dir()]
    shutil.copytree(site, where, ignore=shutil.ignore_patterns("__pycache__"))
    module = where / "intellect_column_credit" / "__init__.py"
    text = module.read_text()
    module.write_text(text.replace("return 0.5 * right / len(expected) + 0.5 * solved", "return 1.0"))
    assert module.read_text() != text
    return {"PYTHONPATH": str(where)}


def _statuses(engine: Engine) -> list[SubmissionStatus]:
    with engine.connect() as connection:
        return list(connection.execute(select(Submission.status)).scalars())


PROBE = """
import json
from intellect_protocol.shared.environments.arithmetic import scratchpad
from intellect_protocol.shared.environments.registry import get_environment, plugin

environment = get_environment("column-credit", plugin("column-credit").pin)
problem = environment.problems()[0]
right = scratchpad(problem.prompt)
steps = right.split(";")
slip = ";".join([steps[0][:-2] + "99", *steps[1:]])
print(json.dumps({label: environment.task_reward(text, problem) for label, text in (("right", right), ("slip", slip), ("none", ""))}))
"""


@pytest.mark.integration
def test_the_example_plugin_gives_credit_per_right_column(example: dict[str, str]) -> None:
    import json

    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, **example}, check=True)
    # Three columns: a slip in the first costs its third of the column half, and the answer still counts.
    assert json.loads(out.stdout) == {"right": 1.0, "slip": pytest.approx(0.5 * 2 / 3 + 0.5), "none": 0.0}


def _words(text: str) -> str:
    """``text`` with its line wrapping (a terminal-width console's) undone."""
    return " ".join(text.split())


TAMPERED_PROBE = """
import json, sys
from intellect_protocol.shared.environments.registry import EnvironmentUnavailable, get_environment, plugin

environment = get_environment("arithmetic")
problem = environment.problems()[0]
try:
    get_environment("arithmetic", sys.argv[1])
    refused = None
except EnvironmentUnavailable as e:
    refused = str(e)
print(json.dumps({"pin": plugin("arithmetic").pin, "reward": environment.task_reward("=" + problem.answer, problem), "refused": refused}))
"""


@pytest.mark.integration
def test_a_changed_builtin_reward_is_another_pin_and_refused_where_the_run_pins_the_original(tmp_path: Path) -> None:
    """Nodes and validators on different commits whose math reward differs: the one whose code is not the run's
    stops before it scores anything (:func:`get_environment` is what the node, the validator and the trainer call)."""
    import json

    copy = tmp_path / "intellect_protocol"
    copy.mkdir()
    for folder in ("coordinator", "node", "validator", "trainer", "devnet", "migrations", "contracts"):
        (copy / folder).symlink_to(ROOT / folder)
    shutil.copytree(ROOT / "shared", copy / "shared", ignore=shutil.ignore_patterns("__pycache__"))
    module = copy / "shared" / "environments" / "arithmetic.py"
    module.write_text(module.read_text().replace("return 1.0 if match", "return 0.5 if match"))

    def probe(env: dict[str, str]) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-c", TAMPERED_PROBE, OURS], capture_output=True, text=True, env={**os.environ, **env}, check=True
        )
        return dict(json.loads(done.stdout))

    original, changed = probe({}), probe({"PYTHONPATH": str(tmp_path)})
    assert (original["pin"], original["reward"], original["refused"]) == (OURS, 1.0, None)
    assert changed["reward"] == 0.5, "the copy computes another reward"
    assert changed["pin"] != OURS and str(changed["pin"]).startswith("intellect-protocol sha256=")
    assert f"is {changed['pin']} here but the run pins {OURS}" in str(changed["refused"])
    assert "its code here differs from the run's" in str(changed["refused"])


GUESS_PROBE = """
import json
from intellect_protocol.shared.environments.registry import get_environment, plugin
from intellect_protocol.shared.environments.turns import rules_of, template_tools
from intellect_protocol.shared.episodes import replay_failures
from intellect_protocol.shared.models import encode_prompt
from intellect_protocol.shared.tiny_model import bpe_tokenizer

environment = get_environment("guess-number", plugin("guess-number").pin)
tokenizer = bpe_tokenizer(300)
problem = next(p for p in environment.problems() if p.answer != "50")  # not found at the first guess
tokens, flags, turns, low, high = [], [], [], 1, 100
while True:  # a binary search, the environment answering each guess
    guess = (low + high) // 2
    turns.append(f"<guess>{guess}</guess>")
    ids = tokenizer.encode(turns[-1], add_special_tokens=False)
    tokens, flags = tokens + ids, flags + [True] * len(ids)
    answer = environment.reply(problem, 0, turns)
    if answer is None:
        break
    ids = tokenizer.encode(answer, add_special_tokens=False)
    tokens, flags = tokens + ids, flags + [False] * len(ids)
    low, high = (guess + 1, high) if answer == "higher" else (low, guess - 1)
rules = rules_of(environment, 512)
replay = dict(tokenizer=tokenizer, environment=environment, problem=problem, seed=0, rules=rules, eos=tokenizer.eos_token_id)
first = flags.index(False)
swapped = {"higher": "lower", "lower": "higher"}[tokenizer.decode(tokens[first:first + flags[first:].index(True)])]
forged = tokenizer.encode(swapped, add_special_tokens=False)
end = first + flags[first:].index(True)
text = tokenizer.decode(tokens)
print(json.dumps({
    "guesses": len(turns),
    "reward": environment.task_reward(text, problem),
    "honest": replay_failures(tokens, flags, "stop", **replay),
    "forged": replay_failures(tokens[:first] + forged + tokens[end:], flags[:first] + [False] * len(forged) + flags[end:], "stop", **replay),
    "prompt": tokenizer.decode(encode_prompt(tokenizer, problem.prompt, tools=template_tools(environment))),
}))
"""


@pytest.mark.integration
def test_the_multi_turn_example_plugin_installs_and_its_episodes_replay(tmp_path: Path) -> None:
    """The guess-number example installs as column-credit does; a binary search played against it replays exactly,
    and a reply forged the other way is found."""
    import json

    where = install_example_environment(tmp_path, "guess-number")
    out = subprocess.run(
        [sys.executable, "-c", GUESS_PROBE], capture_output=True, text=True, env={**os.environ, **where}, check=True
    )
    played = json.loads(out.stdout)
    assert 1 <= played["guesses"] <= 7 and played["reward"] == pytest.approx(1.0 - 0.1 * (played["guesses"] - 1))
    assert played["honest"] is None
    assert "is not what the environment gives" in played["forged"]
    assert "Tool guess: Guess the number" in played["prompt"]  # its template renders no tools: written before the problem
