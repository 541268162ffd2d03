"""What `pip install` puts into site-packages: one top-level name, `intellect_protocol`, and
everything the roles read at run time (migrations, the tiny model, the page, the contracts)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("shared", "coordinator", "node", "validator", "trainer", "devnet", "migrations", "contracts")
SCRIPTS = (
    "intellect-coordinator",
    "intellect-node",
    "intellect-devnet",
    "intellect-relay",
    "intellect-validator",
    "intellect-trainer",
)


def _wheel(tmp_path: Path) -> Path:
    """Build the wheel from a copy of the sources, so the build leaves nothing in the checkout."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "wheel")]
    subprocess.run([*pip, str(source)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    return wheel


def test_the_install_adds_one_namespace_and_everything_the_roles_read(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"intellect_protocol"}
    for folder in FOLDERS:
        assert f"intellect_protocol/{folder}/__init__.py" in names
    assert any(n.startswith("intellect_protocol/migrations/versions/0001_") for n in names)
    assert "intellect_protocol/shared/assets/tiny-arith/model.safetensors" in names
    assert "intellect_protocol/coordinator/web/index.html" in names
    assert "intellect_protocol/contracts/artifacts/StakeRegistry.json" in names

    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    installed = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")} - {"bin"}
    assert installed == {"intellect_protocol"}
    for script in SCRIPTS:
        assert "from intellect_protocol." in (site / "bin" / script).read_text()

    # From the installed copy alone (no site-packages, no checkout on the path): the migrations are there
    # and a generic name such as `shared` or `migrations` is not importable.
    probe = (
        f"import sys; sys.path[:] = [{str(site)!r}] + [p for p in sys.path if 'python3' in p and 'site-packages' not in p]\n"
        "import importlib.util, pathlib, intellect_protocol.migrations as m\n"
        "print(len(list((pathlib.Path(m.__file__).parent / 'versions').glob('0*.py'))), m.__file__)\n"
        "print([n for n in ('shared', 'migrations', 'node', 'coordinator') if importlib.util.find_spec(n)])\n"
    )
    out = subprocess.run([sys.executable, "-S", "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path)
    count, where = out.stdout.splitlines()[0].split(" ", 1)
    assert int(count) == len(list((ROOT / "migrations" / "versions").glob("0*.py"))) and where.startswith(str(site))
    assert out.stdout.splitlines()[1] == "[]"
