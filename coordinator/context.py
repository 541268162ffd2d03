"""What the coordinator's routes share, in one typed object: built once by ``create_app``, kept on
``app.state.context`` and reached through the :data:`~coordinator.deps.Ctx` dependency."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import Engine

from intellect_protocol.coordinator.anchoring import Anchorer
from intellect_protocol.coordinator.blobs import BlobStore
from intellect_protocol.coordinator.cache import TtlCache
from intellect_protocol.coordinator.clock import Clock
from intellect_protocol.coordinator.ledger import Ledger
from intellect_protocol.coordinator.loops import Loop
from intellect_protocol.coordinator.metrics import Metrics
from intellect_protocol.coordinator.services.rate_limit import RateLimiter
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.stakes import StakeBook
from intellect_protocol.coordinator.wakeup import Waiters, Wakeup
from intellect_protocol.shared.environments.bounded import BoundedRewards
from intellect_protocol.shared.settlement import SettlementOverview

POLICY_STEPS_TTL_S = 1.0
"""Heartbeats, the hottest path, read active runs' policy steps at most this often."""
OVERVIEW_TTL_S = 5.0
"""The settlement overview costs chain reads per node: nobody may make the coordinator hammer its RPC."""

PUBLIC_READ_TTL_S = 2.0
"""How long a public aggregate serves every reader before it is computed again: a page refreshes every few
seconds, and a flood of readers costs one query per interval."""


@dataclass
class Context:
    settings: CoordinatorSettings
    engine: Engine
    ledger: Ledger
    audience: str
    """The deployment's id, bound into every signature (a request signed for another deployment fails)."""
    metrics: Metrics
    blobs: BlobStore
    loops: list[Loop]
    rate_limiter: RateLimiter
    """Unsigned and signed requests, per client."""
    registration_limiter: RateLimiter
    """New nodes per client IP."""
    aggregate_limiter: RateLimiter
    """Reads of the public aggregates, per client IP."""
    newcomer_uploads: RateLimiter
    """Uploads of nodes with no accepted file, per client network (``newcomer_uploads_per_s``)."""
    newcomer_reviews: RateLimiter
    """Reviews of newcomers' files handed to validators, all together (``newcomer_reviews_per_s``)."""
    anchorer: Anchorer | None = None
    """Settlement on a chain, when the deployment has one."""
    stakes: StakeBook | None = None
    staging: Counter[str] = field(default_factory=Counter)
    """Uploads being staged, per claimed address and kind (new or retry)."""
    manifest_published: Wakeup = field(default_factory=Wakeup)
    work_arrived: Wakeup = field(default_factory=Wakeup)
    """A verdict: the trainer's long polls for accepted work look at once."""
    validators_waiting: Waiters = field(default_factory=Waiters)
    """Validators' long polls for reviews, each woken when work it may take now is drawn for it."""
    policy_steps: TtlCache[None, dict[str, int]] = field(default_factory=lambda: TtlCache(POLICY_STEPS_TTL_S))
    settlement_overviews: TtlCache[int, SettlementOverview] = field(default_factory=lambda: TtlCache(OVERVIEW_TTL_S))
    public_reads: TtlCache[tuple[object, ...], bytes] = field(default_factory=lambda: TtlCache(PUBLIC_READ_TTL_S, max_keys=1024))
    """Public aggregates (throughput, leaderboard, validators) as rendered JSON, by route and parameters."""
    rewards: dict[tuple[str, str], BoundedRewards] = field(default_factory=dict)
    """Each run environment's reward in a bounded process, by name and pin: it reproduces failures nodes report."""

    def rewards_of(self, environment: str, pin: str) -> BoundedRewards:
        if (environment, pin) not in self.rewards:
            self.rewards[(environment, pin)] = BoundedRewards(environment, pin)
        return self.rewards[(environment, pin)]

    @property
    def clock(self) -> Clock:
        """The coordinator's one clock (:mod:`coordinator.clock`), which the ledger reads."""
        return self.ledger.now
