"""The layout's rules, checked on the source: roles share code only through ``shared/``, and the
coordinator never loads torch (it must stay light)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("coordinator", "node", "validator", "trainer")


def _imports(folder: str) -> list[tuple[str, str]]:
    """(file, imported module) for every import under ``folder``."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.name, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((path.name, node.module))
    return found


@pytest.mark.parametrize("role", ROLES)
def test_a_role_imports_no_other_role(role: str) -> None:
    others = [f"intellect_protocol.{r}" for r in ROLES if r != role]
    crossing = [(f, m) for f, m in _imports(role) if any(m == o or m.startswith(o + ".") for o in others)]
    assert crossing == []


def test_the_coordinator_never_imports_torch() -> None:
    assert [(f, m) for f, m in _imports("coordinator") if m.split(".")[0] == "torch"] == []


def test_every_import_of_ours_goes_through_the_namespace() -> None:
    generic = {"shared", "coordinator", "node", "validator", "trainer", "devnet", "migrations", "contracts"}
    for folder in (*ROLES, "shared", "devnet", "migrations", "contracts"):
        assert [(f, m) for f, m in _imports(folder) if m.split(".")[0] in generic] == [], folder
