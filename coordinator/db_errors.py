"""What to do when the ledger's database cannot be used, in one sentence instead of a traceback.

:func:`check_url` refuses what can never work before anything connects (a URL that does not
parse, a database we do not support, a driver that is not installed); :func:`explain` turns
what fails later, on connecting, into a :class:`DatabaseError` naming the likely fix.
"""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

SUPPORTED = {"sqlite": None, "postgresql": "psycopg"}
"""Backends the ledger runs on, and the driver module each needs beyond the standard library."""


class DatabaseError(RuntimeError):
    """The ledger's database cannot be used; the message says what to do."""


def shown(url: str) -> str:
    """``url`` with any password masked, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def check_url(url: str) -> None:
    """Raise :class:`DatabaseError` for a URL that can never work; return quietly otherwise."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DatabaseError(f"{url!r} is not a database URL: use sqlite:///PATH or postgresql://USER@HOST/DATABASE.") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        raise DatabaseError(
            f"The ledger runs on SQLite or PostgreSQL, not {backend!r}: use sqlite:///PATH or postgresql://USER@HOST/DATABASE."
        )
    driver = SUPPORTED[backend]
    if driver is not None:
        try:
            __import__(driver)
        except ImportError:
            raise DatabaseError(
                f"PostgreSQL needs the {driver} driver, which is not installed: pip install 'intellect-protocol[postgres]' "
                "(from a checkout: pip install -e '.[postgres]')."
            ) from None


def explain(error: OperationalError, url: str) -> DatabaseError:
    """The one-sentence reason ``error`` (raised while connecting to ``url``) stopped us, and what to do."""
    detail = str(error.orig).strip().splitlines()[0] if error.orig is not None else str(error)
    parsed = make_url(url)
    where = f"{parsed.host or 'localhost'}:{parsed.port or 5432}"
    if "resolve host" in detail or "translate host name" in detail:
        return DatabaseError(
            f"Cannot resolve the database host {parsed.host!r}: check the host name in the database URL ({shown(url)})."
        )
    if "Connection refused" in detail or "timeout expired" in detail or "No route to host" in detail:
        return DatabaseError(f"Nothing answers at {where} for {shown(url)}: start PostgreSQL there, or fix the host and port.")
    if "authentication failed" in detail or "no password supplied" in detail:
        return DatabaseError(f"PostgreSQL at {where} refused the credentials in {shown(url)}: check the user and password.")
    if "does not exist" in detail:
        return DatabaseError(f"PostgreSQL at {where} says: {detail}; create it first (createdb), then migrate.")
    if "unable to open database file" in detail:
        return DatabaseError(
            f"Cannot open the SQLite file of {shown(url)}: does its directory exist, and may this user write there?"
        )
    return DatabaseError(f"Cannot use the database at {shown(url)}: {detail}.")
