"""Run untrusted Python in a throwaway sandbox: a private, size-capped temp dir, resource limits, no network.

Only inside bubblewrap (``bwrap``): without it nothing confines the code, so :func:`confinement` refuses
(:class:`SandboxUnavailable`, one sentence). The process sees the machine read-only, its files read-only
in a working directory of its own on a private tmpfs of ``Limits.scratch_bytes`` (its ``/tmp``: whatever
it writes, it writes there, and all of it is gone with it), in new user, pid, network and IPC namespaces
that die with it. It runs under rlimits (CPU seconds, address space, file size, process count, open files) and a
wall-clock timeout that kills its whole process group. Started as root, each sandbox runs as
a user id of its own, held for its lifetime by a lock, so the process-count limit (counted per
user) binds one sandbox alone: a fork bomb in one cannot starve a sandbox beside it, and every
process left under that id is killed before the id is handed on.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SCRATCH = "/tmp/work"
"""The code's working directory inside the sandbox, on its private tmpfs."""

SANDBOX_UIDS = range(600_000, 604_096)
"""User ids no account uses; one per live sandbox on this machine."""
UID_LOCKS = Path(tempfile.gettempdir()) / "intellect-sandbox-uids"


def interpreter() -> str:
    """A Python that any user may execute: the system one when ours lives in root's home."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        if os.access(candidate, os.X_OK) and (os.geteuid() != 0 or _world_executable(Path(candidate))):
            return candidate
    raise RuntimeError("no Python interpreter the sandbox user can run; install python3 system-wide")


_KILL_ALL_OF_MY_USER = """
import os, signal
try:
    os.kill(-1, signal.SIGKILL)  # every process this user may signal, the caller excepted
except ProcessLookupError:
    pass
"""


@contextlib.contextmanager
def _own_uid() -> Iterator[int]:
    """A user id no other live sandbox holds, locked until the sandbox ends (the lock dies with
    this process too), with nothing left running under it afterwards."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    if UID_LOCKS.stat().st_uid != 0 or UID_LOCKS.stat().st_mode & 0o077:
        raise RuntimeError(f"{UID_LOCKS} must be root's alone; remove it")
    start = random.randrange(len(SANDBOX_UIDS))
    for i in range(len(SANDBOX_UIDS)):
        uid = SANDBOX_UIDS[(start + i) % len(SANDBOX_UIDS)]
        fd = os.open(UID_LOCKS / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            _kill_everything_of(uid)  # a holder that died mid-run may have left processes behind
            yield uid
        finally:
            _kill_everything_of(uid)
            os.close(fd)
        return
    raise RuntimeError(f"all {len(SANDBOX_UIDS)} sandbox user ids are in use")


def _kill_everything_of(uid: int) -> None:
    """SIGKILL every process running as ``uid``, including any that left the process group."""
    subprocess.run(
        [interpreter(), "-I", "-S", "-c", _KILL_ALL_OF_MY_USER],
        user=uid,
        group=uid,
        extra_groups=[],
        env={},
        check=True,
    )


def _world_executable(path: Path) -> bool:
    """Whether every directory on the way and the file itself grant execute to others."""
    resolved = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in [resolved, *resolved.parents])


class SandboxUnavailable(RuntimeError):
    """This machine cannot confine untrusted code (no working bubblewrap)."""


@functools.cache
def confinement() -> str:
    """The ``bwrap`` that confines sandboxes, checked once to start one; :class:`SandboxUnavailable` where
    it is missing or cannot make its namespaces (a container that forbids them)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"{NEEDS}, and this machine lacks it: apt-get install bubblewrap")
    if not _starts(bwrap):
        raise SandboxUnavailable(f"{NEEDS}, and {bwrap} cannot make its namespaces here (user namespaces disabled?)")
    return bwrap


NEEDS = (
    "The code environment runs completions only inside bubblewrap (no network, a private size-capped "
    "temporary directory, the machine read-only)"
)


def _starts(bwrap: str) -> bool:
    """Whether ``bwrap`` makes its namespaces as a sandbox's user does (root's own may succeed where a user's fail)."""
    probe = [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"]
    if os.geteuid() != 0:
        return subprocess.run(probe, capture_output=True).returncode == 0
    with _own_uid() as uid:
        return subprocess.run(probe, capture_output=True, user=uid, group=uid, extra_groups=[]).returncode == 0


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 << 20
    output_bytes: int = 64 << 10
    processes: int = 32
    scratch_bytes: int = 16 << 20
    """Most bytes the code may keep written at once, in every file together (its private tmpfs)."""


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


def _command(workdir: Path, names: list[str], limits: Limits, argv: list[str]) -> list[str]:
    """``argv`` inside bubblewrap, with ``names`` of ``workdir`` bound read-only into its working directory."""
    files = [arg for name in names for arg in ("--ro-bind", str(workdir / name), f"{SCRATCH}/{name}")]
    return [
        confinement(),
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--size",
        str(limits.scratch_bytes),
        "--tmpfs",
        "/tmp",
        *files,
        "--chdir",
        SCRATCH,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        SCRATCH,
        *argv,
    ]


def run_python(files: dict[str, str], script: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Write ``files`` into a fresh temp dir and run ``python -I script`` there under the limits."""
    limits = limits or Limits()
    if os.geteuid() != 0:
        return _run(files, script, stdin, limits, None)
    with _own_uid() as uid:
        return _run(files, script, stdin, limits, uid)


def _run(files: dict[str, str], script: str, stdin: str, limits: Limits, uid: int | None) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="intellect-sandbox-") as tmp:
        workdir = Path(tmp)
        if uid is not None:  # its own, out of reach of every other sandbox
            os.chown(workdir, uid, uid)
        for name, content in files.items():
            (workdir / name).write_text(content)
        out_path = workdir / ".stdout"
        with open(out_path, "wb") as out:
            process = subprocess.Popen(
                _limited(limits, _command(workdir, list(files), limits, [interpreter(), "-I", "-B", f"{SCRATCH}/{script}"])),
                cwd=workdir,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": "/usr/bin:/bin"},
                user=uid,
                group=uid,
                extra_groups=[] if uid is not None else None,
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
