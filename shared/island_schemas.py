"""Wire schemas of trainer islands: trainer sites that train on their own share of accepted rollouts and
meet every ``sync_every`` inner steps for a DiLoCo outer step (:mod:`trainer.islands`).

How a share moves (:mod:`coordinator.services.islands`): an island *claims* accepted submissions no
island holds; before an outer step it *reports* the claims its pseudo-gradient holds (pending under that
step and its attempt); after it, every island of the meeting *vouches* for the step's content, publisher and
record, and the step is published only once most live islands vouch for what is published and who publishes
it (:mod:`coordinator.services.step_vouches`); the island that publishes the step's policy *settles* it with
that record, naming the attempts the average included: their claims are consumed, every other pending claim
of that step or older goes back to the pool. An island that starts (or restarts) *joins*: its claims not yet reported go back, since
whatever it learned from them died with it. Claims of an island silent for the lease go back too.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from intellect_protocol.shared.pretraining.manifest import ShardRef
from intellect_protocol.shared.schemas import INT32_MAX, Address, Request
from intellect_protocol.shared.shardcast.chunking import DEFAULT_CHUNK_SIZE, Hex64

IslandName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
Attempt = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
"""One try at one outer step by one island (a new one after a failed commit): 32 hex digits."""
Cursor = Annotated[int, Field(ge=1, le=INT32_MAX)]
MAX_SHARE = 10_000
"""Claims one island may report for one outer step."""


DILOCO_H = 50
"""From this many inner steps between outer steps, the outer optimizer defaults to DiLoCo's (tuned for
hundreds): fewer, and it defaults to plain averaging. With one inner step an outer step and Nesterov
momentum 0.9 at lr 0.7, two honest islands fell from 0.67 to 0.405 held-out accuracy in 20 steps."""


class OuterSettings(BaseModel):
    """How islands meet (a run setting): DiLoCo's outer step, every ``sync_every`` inner GRPO steps."""

    model_config = ConfigDict(extra="forbid")

    sync_every: int = Field(4, ge=1, le=10_000)
    """H: inner policy updates (each on ``groups_per_step`` groups) an island takes between outer steps."""
    outer_lr: float = Field(None, gt=0, le=10)  # type: ignore[assignment]
    """The outer Nesterov SGD's learning rate on the averaged pseudo-gradient; by default 1.0 (plain
    averaging) below :data:`DILOCO_H` inner steps, DiLoCo's 0.7 from there."""
    outer_momentum: float = Field(None, ge=0, lt=1)  # type: ignore[assignment]
    """The outer Nesterov SGD's momentum; by default 0 below :data:`DILOCO_H` inner steps, DiLoCo's 0.9 from there."""

    @model_validator(mode="before")
    @classmethod
    def _defaults_for_h(cls, data: Any) -> Any:
        if isinstance(data, dict):
            h = data.get("sync_every", 4)  # unchecked yet: anything but a whole number is refused after this
            diloco = isinstance(h, int) and h >= DILOCO_H
            data = {**data}
            if data.get("outer_lr") is None:
                data["outer_lr"] = 0.7 if diloco else 1.0
            if data.get("outer_momentum") is None:
                data["outer_momentum"] = 0.9 if diloco else 0.0
            if data.get("screen_directions") is None:
                data["screen_directions"] = diloco
        return data

    min_islands: int = Field(1, ge=1, le=1000)
    """Fewest islands whose pseudo-gradients an outer step judges (those left out as unsound count: a liar that
    gets itself left out must not stall the others); with fewer it takes none, and the islands meet again after
    their next inner steps. 1 lets any island step the run alone, a lying one too; 3, in a run of three islands
    or more, leaves one liar unable to steer a step."""
    chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=4096, le=2**31)
    """Bytes per shardcast chunk of a published step: every island chunks the agreed weights alike, so the
    manifests they vouch for agree."""
    screen_directions: bool = Field(None)  # type: ignore[assignment]
    """With three islands or more, leave out one whose pseudo-gradient points against every other one's while the
    rest agree (:func:`trainer.robust_average.against_the_rest`). By default on from :data:`DILOCO_H` inner steps, where
    honest pseudo-gradients share a direction; below, honest ones can point against each other, and a liar could
    then choose which honest island the screen leaves out."""
    overlap: bool = False
    """Streaming DiLoCo's overlap (:meth:`trainer.islands.OuterSync.launch`): each meeting runs while the next round's
    inner steps do, so a link slower than a round's compute costs no waiting; a round then starts from the agreed
    weights one outer step older (outer step ``k``'s pseudo-gradient is taken from policy step ``k - 1``). Islands of
    one rank only."""
    outlier_ratio: float = Field(10.0, gt=1, le=1e6)
    """An island whose pseudo-gradient's norm, measured on what it sent, exceeds this times the upper median of
    all the measured norms is left out of the step (the others are clipped to the lower median)."""


class IslandJoin(Request):
    address: Address
    run_id: str = Field(max_length=64)
    island: IslandName


class IslandClaim(IslandJoin):
    limit: int = Field(100, ge=1, le=500)
    wait_s: float = Field(0.0, ge=0, le=10)
    """Hold the request up to this long for the first unclaimed submission."""


class IslandReport(IslandJoin):
    outer_step: int = Field(ge=0, le=INT32_MAX)
    attempt: Attempt
    cursors: list[Cursor] = Field(max_length=MAX_SHARE)
    """Claims held by this island that its pseudo-gradient for ``outer_step`` learned from, in the order it learnt
    them (a pretraining audit replays them in it)."""
    start_digest: Hex64 | None = None
    """Overlapped rounds (:meth:`trainer.islands.OuterSync.launch`): sha256 of this island's pseudo-gradient in the step
    before, which its round subtracted from the agreed weights to start from (None: it started from them)."""


class Included(BaseModel):
    model_config = ConfigDict(extra="forbid")

    island: IslandName
    attempt: Attempt
    digest: Hex64 | None = None
    """sha256 of its pseudo-gradient's bytes as every island of the meeting received them (bf16), in a run whose steps
    are audited: the islands that vouch for the step's record vouch for it, so what an audit replays against is what
    was averaged, whoever uploads it (:mod:`coordinator.services.island_audits`)."""


class SettleReply(BaseModel):
    consumed: int
    """Claims consumed by this settling (0 when settled before)."""
    audits: list[Hex64] = Field(default_factory=list)
    """Digests of the step's pseudo-gradients drawn for audit and not uploaded yet: the settling island uploads each
    (``PUT /v1/trainer/runs/ID/pseudo-gradients/DIGEST``)."""


class IslandSettle(IslandJoin):
    """Sent by the island that published policy step ``outer_step + 1``."""

    outer_step: int = Field(ge=0, le=INT32_MAX)
    included: list[Included] = Field(max_length=256)
    """The attempts the average was taken over: their reported claims are consumed."""
    excluded: dict[IslandName, Annotated[str, Field(max_length=300)]] = Field(default_factory=dict, max_length=256)
    """Islands left out of the step, and why (shown on the run's status)."""


class IslandVouch(IslandJoin):
    """Sent by every island of a committed meeting: what policy step ``step`` holds and who publishes it."""

    step: int = Field(ge=1, le=INT32_MAX)
    content: Hex64
    """The :meth:`~shared.shardcast.manifest.Manifest.content_digest` of the agreed weights, built by this island."""
    publisher: IslandName
    """The island the meeting chose to publish the step."""
    record: Hex64
    """The step's record as this island computed it (:func:`step_record`): only that record settles the step."""


class IslandHealCheck(IslandJoin):
    """Sent by an island that just received a peer's state for policy step ``step``: is it the run's agreed state?"""

    step: int = Field(ge=0, le=INT32_MAX)
    content: Hex64
    """The :meth:`~shared.shardcast.manifest.Manifest.content_digest` of the received weights, built by this island."""


class ShardSlot(BaseModel):
    """One training shard of a pretraining run in one epoch, as an island holds it: its claim's cursor is
    ``epoch * shards + index + 1``, so each shard is learnt once an epoch, epoch after epoch."""

    cursor: Cursor
    epoch: int = Field(ge=0)
    index: int = Field(ge=0)
    """The shard's place in the corpus' training shards."""
    shard: ShardRef


class ShardClaims(BaseModel):
    """What a pretraining island's claim returns."""

    slots: list[ShardSlot]
    """The caller's claims, those it held unreported already first."""
    remaining: int = Field(ge=0)
    """Slots of the run not yet consumed (learnt from in a published step), the caller's among them: 0 once the
    run has learnt every epoch of its corpus."""


def step_record(included: list[Included], excluded: dict[str, str]) -> str:
    """The digest of an outer step's record: the attempts its average included, in order (with what each sent, where
    kept), and the islands left out and why. Every honest island of the meeting computes the same."""
    record = {
        "included": [[i.island, i.attempt] + ([i.digest] if i.digest else []) for i in included],
        "excluded": sorted(excluded.items()),
    }
    return hashlib.sha256(json.dumps(record, separators=(",", ":")).encode()).hexdigest()


class IslandStatus(BaseModel):
    """One island of a run, as the public status shows it."""

    name: str
    address: str
    joined_at: datetime
    last_seen: datetime
    outer_step: int
    """The last outer step it took part in (-1: none yet)."""
    claimed: int
    pending: int
    consumed: int
    """Accepted submissions it holds unreported, reported for a step not yet settled, and trained on."""
    excluded_steps: int
    last_exclusion: str | None
    tokens: int | None = None
    """In a pretraining run, the tokens of the corpus it learnt that published steps took in (None: an RL run)."""
    audits: dict[str, int] | None = None
    """In a pretraining run, its pseudo-gradients' audits by state (:class:`~shared.states.AuditState`: passed,
    failed, open...; None: an RL run)."""
