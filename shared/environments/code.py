"""Code with unit tests: score = fraction of a problem's tests the completion's code passes.

The code is the completion's last fenced Python block (or the whole completion when it has
none). Each test, one ``assert`` snippet, runs in its own sandboxed process
(:mod:`shared.environments.sandbox`) after the code. A test passes when that process prints
a marker it read from stdin before the untrusted code ran and exits 0, so code that merely
exits early or prints a constant does not pass. (Code that inspects its own interpreter to
find the marker could; a validator recomputes rewards the same way, so this is a reward the
policy might learn to hack, not a way for a node to lie.)
"""

from __future__ import annotations

import re
import secrets

from shared.environments.sandbox import Limits, run_python

FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
MAX_CODE_CHARS = 20_000

HARNESS = """\
import sys
_marker = sys.stdin.readline().strip()
sys.stdin.close()
_scope = {"__name__": "solution"}
exec(compile(open("solution.py").read(), "solution.py", "exec"), _scope)
exec(compile(open("test.py").read(), "test.py", "exec"), _scope)
print("\\n" + _marker, flush=True)
"""


def extract_code(completion: str) -> str:
    blocks = FENCE.findall(completion)
    return (blocks[-1] if blocks else completion)[:MAX_CODE_CHARS]


def reward(completion: str, tests: list[str], limits: Limits | None = None) -> float:
    """Fraction of ``tests`` passed by the completion's code (0.0 for no tests)."""
    if not tests:
        return 0.0
    code = extract_code(completion)
    passed = 0
    for test in tests:
        marker = secrets.token_hex(16)
        result = run_python(
            {"solution.py": code, "test.py": test, "harness.py": HARNESS}, "harness.py", stdin=marker + "\n", limits=limits
        )
        if result.returncode == 0 and result.stdout.rstrip().endswith(marker):
            passed += 1
    return passed / len(tests)
