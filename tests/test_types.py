"""mypy over every product package (the packages and settings are pyproject's ``[tool.mypy]``), as a
unit test so that it runs beside the other unit tests on the second core rather than before them."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

pytestmark = [pytest.mark.unit, pytest.mark.early]

ROOT = Path(__file__).resolve().parent.parent


CACHE = Path.home() / ".cache" / "intellect-protocol" / "mypy"
"""Outside the checkout, so a fresh clone on the same machine (CI's) checks incrementally: mypy
re-checks whatever changed by content, so a cache from another commit is still sound."""


@pytest.mark.timeout(600)  # from an empty cache, on a busy core
def test_every_product_package_type_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # mypy_path is relative to the working directory
    report, errors, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(CACHE)])
    assert status == 0, report + errors
