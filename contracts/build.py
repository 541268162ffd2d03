"""Compile the contracts into ``contracts/artifacts/<Name>.json`` (ABI, deploy bytecode, compiler).

``python -m intellect_protocol.contracts.build`` rewrites the artifacts; ``--check`` (CI) compiles and fails if any
checked-in artifact differs from its source, so what nodes and the coordinator deploy and call
is always what the source says. The compiler is pinned: another version compiles other bytes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import typer

HERE = Path(__file__).parent
ARTIFACTS = HERE / "artifacts"
COMPILER = "0.4.3"


SNEKMATE = "0.1.2"
"""The audited Vyper modules the contracts import (access control, Merkle proofs), pinned like the compiler."""


def _snekmate_root() -> Path:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("snekmate")
    except PackageNotFoundError:
        found = None
    if found != SNEKMATE:
        raise SystemExit(f"contracts import snekmate=={SNEKMATE}, found {found}: pip install snekmate=={SNEKMATE}")
    import snekmate

    return Path(next(iter(snekmate.__path__))).parent


def compile_contract(source: Path) -> dict[str, object]:
    import vyper

    if vyper.__version__ != COMPILER:
        raise SystemExit(f"contracts compile with vyper=={COMPILER}, found {vyper.__version__}: pip install vyper=={COMPILER}")
    from vyper.compiler.input_bundle import FilesystemInputBundle

    text = source.read_text()
    bundle = FilesystemInputBundle([HERE, _snekmate_root()])
    out = vyper.compile_code(text, contract_path=source.name, input_bundle=bundle, output_formats=["abi", "bytecode"])
    return {
        "contract": source.stem,
        "compiler": f"vyper {COMPILER}, snekmate {SNEKMATE}",
        "source_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "abi": out["abi"],
        "bytecode": out["bytecode"],
    }


def render(artifact: dict[str, object]) -> str:
    return json.dumps(artifact, indent=1, sort_keys=True) + "\n"


def main(
    check: bool = typer.Option(False, "--check", help="Fail if a checked-in artifact differs from its compiled source."),
) -> None:
    """Compile every contracts/*.vy into contracts/artifacts/."""
    stale = []
    for source in sorted(HERE.glob("*.vy")):
        path = ARTIFACTS / f"{source.stem}.json"
        text = render(compile_contract(source))
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
            continue
        ARTIFACTS.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(HERE.parent)}")
    if stale:
        print(
            f"artifacts differ from their source: {', '.join(stale)}; run python -m intellect_protocol.contracts.build and commit",
            file=sys.stderr,
        )
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
