"""Roles forked from a process that has already imported torch and transformers.

Importing ``transformers.modeling_utils`` (torch with it) costs every node, validator and trainer 5-11 s
of CPU before it does anything, and a devnet starts several of them and restarts some. A launcher
instead forks them from one multiprocessing forkserver that paid that once; each child then runs the
role's console script exactly as the shell would run ``intellect-node ...``: same argv (shown by
``ps``), environment, log, and a session of its own. Only third-party modules are preloaded: our own
code is imported fresh in every child, as in a cold start.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import signal
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import setproctitle

WARM_SCRIPTS = frozenset({"intellect-node", "intellect-validator", "intellect-trainer"})
"""The console scripts that load a model, so are worth forking warm; the rest (the coordinator, which must
not load model code, the relay, anvil) start cold."""

PRELOAD = ["torch", "transformers.modeling_utils", "transformers.models.auto.modeling_auto", "eth_account"]
"""What the forkserver imports once, before any role forks from it."""

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


LOAD_TIME_ENV = ("PYTHON", "LD_", "OMP_", "MKL_", "TORCH", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
"""Prefixes of variables read when the interpreter or a preloaded library starts (``PYTHONPATH`` and its
``sitecustomize``, thread counts, hub settings): a role given values of its own for them starts cold."""


def is_warm(args: list[str], env: dict[str, str]) -> bool:
    """Whether ``args`` with environment ``env`` can fork from the forkserver and behave as a cold start would."""
    if Path(args[0]).name not in WARM_SCRIPTS:
        return False
    names = {n for n in env.keys() | os.environ.keys() if n.startswith(LOAD_TIME_ENV) and n != "PYTHONUNBUFFERED"}
    return all(env.get(n) == os.environ.get(n) for n in names)


def _unbuffered(fd: int) -> io.TextIOWrapper:
    raw = open(fd, "wb", buffering=0, closefd=False)  # noqa: SIM115 (lives as long as the process)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", write_through=True)


def _run(args: list[str], env: dict[str, str], log_path: str) -> None:
    """In the forked child: become the console script ``args[0]`` run with ``args[1:]``."""
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout, sys.stderr = _unbuffered(1), _unbuffered(2)
    # Before the environment changes: the title takes over the memory the interpreter's argv and environ are in.
    setproctitle.setproctitle(" ".join(args))
    sys.argv = list(args)
    os.environ.clear()
    os.environ.update(env)
    # Preparing this child, multiprocessing imported the launcher's main module, and with it whatever of our code that
    # imports, under the forkserver's environment (the launcher's when the forkserver started): forget it, so the
    # role imports our code afresh under its own, as a cold start would.
    for name in [n for n in sys.modules if n.partition(".")[0] == __name__.partition(".")[0]]:
        del sys.modules[name]
    (script,) = entry_points(group="console_scripts", name=Path(args[0]).name)
    try:
        sys.exit(script.load()())
    finally:
        # The forkserver's child leaves with os._exit: run what a normal interpreter runs at exit.
        atexit._run_exitfuncs()


class WarmPopen:
    """The part of :class:`subprocess.Popen` the launchers use, for a role forked warm."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.args = args
        self._process = _CONTEXT.Process(target=_run, args=(args, env, str(log_path)), name=Path(args[0]).name)
        self._process.start()
        # Not joined when the launcher exits, as a subprocess would not be: a role outliving its launcher is the
        # launcher's stop to make, and a join would hang its exit instead.
        multiprocessing.process._children.discard(self._process)  # type: ignore[attr-defined]
        self.pid: int = self._process.pid  # type: ignore[assignment]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
