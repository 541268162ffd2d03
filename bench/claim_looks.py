"""What one look of a validator's long-polled claim costs the coordinator, on a real SQLite ledger.

A claim waits up to ``wait_s`` for work and looks again whenever an upload or a verdict wakes it, so
with every validator waiting, each file the network handles sets off several looks that find
nothing. The first look of a claim checks the validator's role and the runs' stake and marks it live
(a write); later looks in the same request only draw (``coordinator.services.validation.draw``).
Before they were split, every look was a first look: that is the baseline, measured in the same run.

Measured in-process (the coordinator's own service functions and transactions, no HTTP), idle: one
active run, one validator, nothing to draw. Median of ``--repeats`` runs of ``--looks`` looks each.

    python bench/claim_looks.py [--looks 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from eth_account import Account
from sqlalchemy.orm import Session, sessionmaker

from intellect_protocol.coordinator.db import make_engine, make_sessionmaker
from intellect_protocol.coordinator.services import roles, validation
from intellect_protocol.coordinator.services.rate_limit import RateLimiter
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.processes import create_run, migrate
from intellect_protocol.shared.schemas import ClaimRequest, RoleName


def per_look_ms(sessions: sessionmaker[Session], look: Callable[[Session], object], looks: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of one look, each in its own transaction, as the route runs it."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(looks):
            with sessions.begin() as session:
                look(session)
        runs.append((time.perf_counter() - start) / looks * 1e3)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--looks", type=int, default=200, help="looks per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each kind of look")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        migrate(url, Path(tmp) / "migrate.log")
        create_run(url, "bench", Path(tmp) / "run.log")
        settings = CoordinatorSettings(database_url=url, blob_dir=Path(tmp) / "blobs")
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        validator = Account.create().address
        with sessions.begin() as session:
            roles.grant(session, validator, RoleName.validator, "bench", datetime.now(UTC))
        body = ClaimRequest(address=validator, limit=8, wait_s=0)
        newcomers = RateLimiter(settings.committee.newcomer_reviews_per_s, 1)

        def first(session: Session) -> object:
            return validation.claim(session, validator, body, settings, datetime.now(UTC), newcomers)

        def later(session: Session) -> object:
            return validation.draw(session, validator, body.limit, settings, datetime.now(UTC), newcomers)

        per_look_ms(sessions, first, args.looks, 1)  # warm the statement cache and the file
        first_ms = per_look_ms(sessions, first, args.looks, args.repeats)
        later_ms = per_look_ms(sessions, later, args.looks, args.repeats)
        engine.dispose()

    print(f"first look (role, stake, live mark, draw): {first_ms:.3f} ms")
    print(f"later look (draw only):                    {later_ms:.3f} ms")
    print(f"a later look costs 1/{first_ms / later_ms:.1f} of a first look (every look was a first look before)")


if __name__ == "__main__":
    main()
