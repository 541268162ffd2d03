"""Process-wide interpreter limits that parsing untrusted input relies on, held where we set them.

py_ecc (imported by eth_account) raises the recursion limit to 100,000 when it is imported.
Under that limit, parsing deeply nested JSON (the C decoder recurses once per level) overflows
the C stack and the process dies with SIGSEGV instead of raising ``RecursionError``: one 240 KB
request could kill a coordinator. Importing :mod:`shared` calls :func:`pin_recursion_limit`, and
every server checks it again as it starts, so no role parses a byte under a raised limit.
"""

from __future__ import annotations

import logging
import sys

RECURSION_LIMIT = 1000
"""CPython's default: deep enough for our code and libraries, far inside an 8 MiB C stack."""

log = logging.getLogger(__name__)


def pin_recursion_limit() -> None:
    """Take the effect of the dependencies known to raise the limit now, then set it back."""
    import py_ecc  # noqa: F401  (its import raises the limit; once imported, it never runs again)

    if sys.getrecursionlimit() != RECURSION_LIMIT:
        log.debug("recursion limit was %d; set back to %d", sys.getrecursionlimit(), RECURSION_LIMIT)
        sys.setrecursionlimit(RECURSION_LIMIT)
