"""Run untrusted Python in a throwaway sandbox: a fresh temp dir, resource limits, no network.

Where bubblewrap (``bwrap``) is installed, the process sees the machine read-only except its
own temp dir, in new user, pid, network and IPC namespaces that die with it. Always, it runs
under rlimits (CPU seconds, address space, file size, process count, open files) and a
wall-clock timeout that kills its whole process group; when started as root it runs as
``nobody``, so the process-count limit binds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534


def interpreter() -> str:
    """A Python that ``nobody`` may execute: the system one when ours lives in root's home."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        if os.access(candidate, os.X_OK) and (os.geteuid() != 0 or _world_executable(Path(candidate))):
            return candidate
    raise RuntimeError("no Python interpreter the sandbox user can run; install python3 system-wide")


def _world_executable(path: Path) -> bool:
    """Whether every directory on the way and the file itself grant execute to others."""
    resolved = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in [resolved, *resolved.parents])


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 << 20
    output_bytes: int = 64 << 10
    processes: int = 32


@dataclass(frozen=True)
class RunResult:
    returncode: int | None
    """None when the wall-clock limit killed it."""
    stdout: str
    timed_out: bool


def _limited(limits: Limits, argv: list[str]) -> list[str]:
    """``argv`` under rlimits, set by util-linux ``prlimit`` (a ``preexec_fn`` is unsafe in a
    threaded process such as a node, whose heartbeats and uploads run on other threads)."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise RuntimeError("prlimit (util-linux) is needed to sandbox code")
    return [
        prlimit,
        f"--cpu={limits.cpu_s}",
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.output_bytes}",
        f"--nproc={limits.processes}",
        "--nofile=64",
        "--core=0",
        "--",
        *argv,
    ]


def _command(workdir: Path, argv: list[str]) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return argv
    return [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--bind",
        str(workdir),
        str(workdir),
        "--chdir",
        str(workdir),
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        str(workdir),
        *argv,
    ]


def run_python(files: dict[str, str], script: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Write ``files`` into a fresh temp dir and run ``python -I script`` there under the limits."""
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="intellect-sandbox-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o777)  # writable by nobody
        for name, content in files.items():
            (workdir / name).write_text(content)
        out_path = workdir / ".stdout"
        with open(out_path, "wb") as out:
            root = os.geteuid() == 0
            process = subprocess.Popen(
                _limited(limits, _command(workdir, [interpreter(), "-I", "-B", str(workdir / script)])),
                cwd=workdir,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": "/usr/bin:/bin"},
                user=NOBODY if root else None,
                group=NOBODY if root else None,
                extra_groups=[] if root else None,
            )
            try:
                process.communicate(stdin.encode(), timeout=limits.wall_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        with open(out_path, "rb") as out:
            stdout = out.read(limits.output_bytes).decode(errors="replace")
    return RunResult(None if timed_out else process.returncode, stdout, timed_out)
