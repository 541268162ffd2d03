"""Code with unit tests: score = fraction of a problem's tests the completion's code passes.

The code is the completion's last fenced Python block (or the whole completion when it has
none). A test is one assertion about a value the code computes:

- ``assert PROBE OP EXPECTED`` (or ``EXPECTED OP PROBE``), OP one of ``== != is is not < <= > >= in not in``;
- ``assert PROBE`` or ``assert not PROBE``;

where EXPECTED holds only literals and arithmetic, and PROBE is any expression (it calls the code).

The verdict never exists where the untrusted code can reach it. Each test's PROBE runs in its
own sandboxed process (:mod:`shared.environments.sandbox`) after the code, and that process
only prints the value's ``repr``; this process reads it back as a literal and makes the
comparison itself. The sandbox holds no expected value, no comparison and no pass marker, so
code that inspects its interpreter, exits early or prints a constant finds nothing to forge.
Dataset tests are trusted input, parsed here when the environment loads them
(:func:`parse_test` raises :class:`UnsupportedTest` for any other shape).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from intellect_protocol.shared.environments.sandbox import Limits, run_python

FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
MAX_CODE_CHARS = 20_000

HARNESS = """\
import sys
_probe = sys.stdin.read()
sys.stdin.close()
_scope = {"__name__": "solution"}
exec(compile(open("solution.py").read(), "solution.py", "exec"), _scope)
_value = eval(compile(_probe, "probe", "eval"), _scope)
print("\\n" + repr(_value), flush=True)
"""

COMPARISONS: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
ARITHMETIC: dict[type[ast.AST], Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}


class UnsupportedTest(ValueError):
    """A test that is not one of the supported assertion shapes; the message says why."""


@dataclass(frozen=True)
class CodeTest:
    probe: str
    """Source of the expression the untrusted process evaluates."""
    passes: Callable[[Any], bool]
    """Whether the probe's value passes, judged here."""


def _expected(node: ast.expr) -> Any:
    """The value of a literals-and-arithmetic expression, or UnsupportedTest."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in ARITHMETIC:
        return ARITHMETIC[type(node.op)](_expected(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        left, right = _expected(node.left), _expected(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, int) and abs(right) > 4096:
            raise UnsupportedTest("an exponent over 4096 in an expected value")
        return ARITHMETIC[type(node.op)](left, right)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_expected(e) for e in node.elts]
        return list(items) if isinstance(node, ast.List) else tuple(items) if isinstance(node, ast.Tuple) else set(items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_expected(k): _expected(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    raise UnsupportedTest(f"{ast.unparse(node)!r} is not made of literals and arithmetic")


def _is_expected(node: ast.expr) -> bool:
    try:
        _expected(node)
    except (UnsupportedTest, ArithmeticError, TypeError, ValueError):
        return False
    return True


def parse_test(source: str) -> CodeTest:
    """The probe and the judgement of one dataset test."""
    try:
        body = ast.parse(source).body
    except SyntaxError as e:
        raise UnsupportedTest(f"not Python: {e.msg}") from None
    if len(body) != 1 or not isinstance(body[0], ast.Assert) or body[0].msg is not None:
        raise UnsupportedTest("a test must be a single assert statement without a message")
    claim = body[0].test
    if isinstance(claim, ast.Compare) and len(claim.ops) == 1 and type(claim.ops[0]) in COMPARISONS:
        compare = COMPARISONS[type(claim.ops[0])]
        left, right = claim.left, claim.comparators[0]
        if _is_expected(right) and not _is_expected(left):
            expected = _expected(right)
            return CodeTest(ast.unparse(left), lambda value: bool(compare(value, expected)))
        if _is_expected(left) and not _is_expected(right):
            expected = _expected(left)
            return CodeTest(ast.unparse(right), lambda value: bool(compare(expected, value)))
        raise UnsupportedTest("a comparison needs exactly one side made of literals and arithmetic")
    if isinstance(claim, ast.UnaryOp) and isinstance(claim.op, ast.Not):
        return CodeTest(ast.unparse(claim.operand), lambda value: not value)
    return CodeTest(ast.unparse(claim), bool)


def extract_code(completion: str) -> str:
    blocks = FENCE.findall(completion)
    return (blocks[-1] if blocks else completion)[:MAX_CODE_CHARS]


def _passes(code: str, test: CodeTest, limits: Limits | None) -> bool:
    result = run_python({"solution.py": code, "harness.py": HARNESS}, "harness.py", stdin=test.probe, limits=limits)
    lines = result.stdout.rstrip().splitlines()
    if result.returncode != 0 or not lines:
        return False
    try:
        value = ast.literal_eval(lines[-1])
        return test.passes(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, ArithmeticError):
        return False


def reward(completion: str, tests: list[str], limits: Limits | None = None) -> float:
    """Fraction of ``tests`` passed by the completion's code (0.0 for no tests)."""
    if not tests:
        return 0.0
    code = extract_code(completion)
    return sum(_passes(code, parse_test(t), limits) for t in tests) / len(tests)
