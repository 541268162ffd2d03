"""What a short role costs started cold (a fresh interpreter imports torch and transformers) and warm (forked from
the devnet's forkserver, devnet/warm.py), in wall and CPU seconds from start to exit.

The role: ``intellect-validator calibrate`` of the shipped tiny model on 16 short rows, as the devnet runs it
before a run on a model of the user's opens; it loads the model, generates and checks. Cold and warm starts
alternate, so both see the same load; the forkserver is started first, and its own imports, paid once per
launcher, are printed beside them. The ratio (cold / warm CPU a start) is printed last, and refused when a cold
start took under two CPU seconds (it cannot have imported what a role needs).

    python bench/warm_start.py [--starts 5]
"""

from __future__ import annotations

import argparse
import multiprocessing.forkserver
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from intellect_protocol.devnet.processes import script
from intellect_protocol.devnet.warm import WarmPopen
from intellect_protocol.shared.models import TINY_MODEL_DIR


def _cold(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def _start(warm: bool, args: list[str], log: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds from start to exit (CPU as last read while it ran, every 10 ms)."""
    started = time.monotonic()
    popen = WarmPopen(args, log, env) if warm else _cold(args, log, env)
    role, cpu = psutil.Process(popen.pid), 0.0
    while popen.poll() is None:
        try:
            cpu = sum(role.cpu_times()[:2])
        except psutil.Error:  # it exited between the poll and the read
            break
        time.sleep(0.01)
    wall = time.monotonic() - started
    if popen.wait() != 0:
        raise SystemExit(f"calibrate exited with {popen.returncode}:\n{log.read_text()[-2000:]}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5, help="starts of each kind, alternating")
    starts = parser.parse_args().starts
    with tempfile.TemporaryDirectory() as tmp:
        args = [*script("intellect-validator"), "calibrate", "--model", str(TINY_MODEL_DIR), "--engine", "torch"]
        args += ["--dtype", "float32", "--rows", "16", "--max-tokens", "8", "--out", str(Path(tmp) / "calibration.json")]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Started before the clock, as the devnet's is by its first role: its imports are reported apart.
        multiprocessing.forkserver.ensure_running()
        took: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for i in range(2 * starts):
            warm = i % 2 == 1
            took[warm].append(_start(warm, args, Path(tmp) / f"{i}.log", env))
            print(f"{'warm' if warm else 'cold'} start {i // 2 + 1}: {took[warm][-1][0]:.2f} s, {took[warm][-1][1]:.2f} CPU-s")
        server = psutil.Process(multiprocessing.forkserver._forkserver._forkserver_pid)  # type: ignore[attr-defined]
        server_cpu = sum(server.cpu_times()[:2])
    (cold_wall, cold_cpu), (warm_wall, warm_cpu) = (
        tuple(statistics.median(column) for column in zip(*took[kind])) for kind in (False, True)
    )
    print(f"\n{'start':<6}{'wall s':>9}{'CPU s':>9}   (medians of {starts})")
    print(f"{'cold':<6}{cold_wall:>9.2f}{cold_cpu:>9.2f}")
    print(f"{'warm':<6}{warm_wall:>9.2f}{warm_cpu:>9.2f}")
    print(f"the forkserver's own imports, once per launcher: {server_cpu:.2f} CPU-s")
    if cold_cpu < 2.0:
        raise SystemExit(f"a cold start took {cold_cpu:.2f} CPU-s: it cannot have imported a role's model code")
    print(f"cold / warm CPU a start: {cold_cpu / warm_cpu:.1f}x")


if __name__ == "__main__":
    main()
