"""The coordinator reads and checks rollout files without the model stack: its process never loads
torch or transformers (1.2 s and about 180 MiB of its start-up, measured)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from intellect_protocol.shared.numerics import DTYPES, Numerics, torch_dtype

pytestmark = pytest.mark.unit

PROBE = """
import sys
from intellect_protocol.coordinator.app import create_app
from intellect_protocol.shared.rollout_file import read_rollouts, shape_error
print(sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules))
"""


def test_the_coordinator_loads_no_model_code() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_coordinator_commands_load_neither_the_web_app_nor_wallets() -> None:
    """Each ``intellect-coordinator`` command is a process of its own: FastAPI and eth_account cost 0.6 s
    of every start, and only ``serve`` (which imports the app itself) needs either."""
    probe = "import sys, intellect_protocol.coordinator.cli; print([m for m in ('fastapi', 'eth_account') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_declared_dtypes_name_torch_dtypes_and_nothing_else() -> None:
    for name in DTYPES:
        model = torch.nn.Linear(2, 2).to(torch_dtype(name))
        assert Numerics.of(model) == Numerics("torch", name) == Numerics.parse(f"torch/{name}")
    with pytest.raises(ValueError, match="not one of"):
        torch_dtype("float64")
    with pytest.raises(ValueError, match="is not ENGINE/DTYPE"):
        Numerics.of(torch.nn.Linear(2, 2).to(torch.float64))
