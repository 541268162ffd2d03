"""Every coordinator setting in one place, read from ``INTELLECT_*`` env vars or a TOML file."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict
from sqlalchemy import make_url

from intellect_protocol.shared.schemas import Address
from intellect_protocol.shared.serving import HeaderLimits
from intellect_protocol.shared.settings import RoleSettings


@dataclass(frozen=True)
class ChainSettings:
    """The chain settings of a deployment that settles on one, all present (see ``CoordinatorSettings.chain``)."""

    rpc_url: str
    token: str
    stake_registry: str
    distributor: str
    keystore: Path


class CoordinatorSettings(RoleSettings):
    model_config = SettingsConfigDict(env_prefix="INTELLECT_", toml_file="intellect-coordinator.toml", extra="ignore")

    database_url: str = "sqlite:///intellect.db"
    """SQLAlchemy URL of the ledger: ``sqlite:///PATH`` (WAL) or ``postgresql+psycopg://...``."""

    db_threads: int = Field(8, ge=1, le=64)
    """Threads running database work on PostgreSQL; SQLite always uses one (it has one writer)."""

    audience: str | None = None
    """Deployment id that signatures are bound to; by default the random one stored at migration."""

    signature_window_s: int = Field(300, ge=5)
    """How far a request's timestamp may be from the coordinator's clock, either way."""

    nonce_retention_s: int = Field(900, ge=10)
    """How long used nonces are kept; raised to at least twice the signature window."""

    heartbeat_interval_s: float = Field(10.0, gt=0)
    """How often nodes are told to heartbeat."""

    unhealthy_after_missed: int = Field(1, ge=1)
    """Heartbeat intervals a healthy node may miss entirely before it counts as unhealthy."""

    dead_after_missed: int = Field(3, ge=1)
    """Heartbeat intervals a node may miss entirely before it counts as dead."""

    status_loop_interval_s: float = Field(1.0, gt=0)
    """How often the background loop re-evaluates node statuses and prunes nonces."""

    rate_limit_per_s: float = Field(20.0, gt=0)
    """Sustained requests per second allowed to one address (or one client IP when unsigned)."""

    rate_limit_burst: int = Field(60, ge=1)
    """Requests one address may send at once before the sustained rate applies."""

    max_body_bytes: int = Field(1 << 20, ge=1024)
    """Largest request body accepted; larger ones get 413 before they are read."""

    max_upload_bytes: int = Field(64 << 20, ge=1024)
    """Largest rollout file a node may upload."""

    max_body_bytes_in_flight: int = Field(1 << 30, ge=1 << 20)
    """Most request-body bytes the coordinator admits at once, over every client: a body counts at
    its declared length (a chunked one at its limit) until its answer is sent, and a request that
    would pass this gets 503 with Retry-After before a byte is read. Bodies larger than
    ``max_body_bytes`` may fill only 7/8 of it, keeping room for small requests. Bounds memory
    under a flood of large uploads from many addresses (buffered bodies cost about twice this at worst)."""

    body_idle_timeout_s: float = Field(15.0, gt=0)
    """Longest pause between two parts of a request body; a slower sender gets 408."""

    body_deadline_s: float = Field(120.0, gt=0)
    """Longest a whole request body may take to arrive (a byte-at-a-time sender gets 408)."""

    max_requests_per_ip: int = Field(256, ge=1)
    """Requests one client IP may have in flight at once; more get 429 (slow-loris style floods)."""

    max_connections_per_ip: int = Field(256, ge=1)
    """Connections one client IP may hold open at once, requests or not; the next is answered 429 and closed."""

    header_timeout_s: float = Field(10.0, gt=0)
    """Longest a request's line and headers may take to arrive; a slower client gets 408 and is closed."""

    max_header_bytes: int = Field(32 << 10, ge=4096)
    """Most bytes a request's line and headers may take; more get 431 and the connection is closed."""

    blob_store: Literal["local", "s3"] = "local"
    """Where rollout files are kept: ``local`` (a directory, ``blob_dir``) or ``s3`` (a bucket of an
    S3-compatible service, ``s3_*``; credentials from the usual ``AWS_*`` variables or ``~/.aws``)."""

    blob_dir: Path | None = None
    """Directory of the local blob store that keeps rollout files; by default ``blobs/`` beside the
    SQLite ledger, or ``~/.intellect/blobs`` with PostgreSQL."""

    s3_bucket: str | None = None
    """The bucket of the ``s3`` blob store (it must exist)."""

    s3_prefix: str = ""
    """Key prefix under which this deployment's rollout files go, to share a bucket."""

    s3_endpoint_url: str | None = None
    """The S3-compatible service, e.g. ``http://minio:9000``; None: AWS S3 itself."""

    s3_region: str | None = None
    """The bucket's region, where the service needs one."""

    relay_ttl_s: float = Field(90.0, gt=0)
    """A relay not heard from for this long drops out of the list clients download from."""

    manifest_wait_max_s: float = Field(30.0, ge=0, le=300)
    """Longest a long-poll for new manifests may hold its request open."""

    validation_claim_s: float = Field(300.0, gt=0)
    """How long a validator has to answer an assignment before it is drawn again."""

    validator_live_s: float = Field(120.0, gt=0)
    """Work is assigned only to validators that asked for work within this long. Long enough to
    cover an honest validator's busiest batch: a validator that asks more often gets no more of it."""

    unassignable_retry_s: float = Field(5.0, gt=0)
    """A review no live validator could be drawn for is not drawn for again before this long: work
    nobody can judge yet (a hold, a thin committee) never crowds out work somebody can."""

    validator_max_strikes: int = Field(3, ge=1)
    """Times a validator may be outvoted by the majority (since it was granted the role) before the
    role is revoked and its recent verdicts are checked again."""

    recheck_window_s: float = Field(86400.0, ge=0)
    """How far back a revoked validator's verdicts are voided and their submissions judged again."""

    appeals_per_day: int = Field(3, ge=0)
    """Appeals one node may file per 24 hours (each costs validators at least two model passes)."""

    dispute_window_s: float = Field(86400.0, ge=0)
    """How long credit stays pending (and can be clawed back) before it is final."""

    prompt_token_weight: Decimal = Field(Decimal("0.1"), ge=0, le=1000, decimal_places=6)
    """Work units per prompt token, an exact decimal; each generated token is one unit."""

    max_strikes: int = Field(3, ge=1)
    """Strikes after which a node is banned: each hard rejection (forged or corrupted work) is one."""

    soft_rejections_per_strike: int = Field(5, ge=1)
    """Soft rejections (wrong rewards, cut completions, other prompts: no forgery, but each costs a
    validator a model pass) within ``soft_rejection_window_s`` that cost a node one strike. Work
    the network made stale before it was checked is *expired*, never counted."""

    soft_rejection_window_s: float = Field(3600.0, gt=0)
    """The window in which soft rejections add up to a strike."""

    linked_addresses: list[list[Address]] = []
    """Groups of addresses one party controls: a validator never checks work from an address in a
    group with its own (nodes it operates, and nodes of its own operator, are linked already)."""

    registrations_per_ip_per_hour: int = Field(20, ge=1)
    """New node addresses one client IP may register per hour (a burst of this many, then evenly
    spread): a banned cheater's next wallet costs it time. Registering an address again is free."""

    task_lease_s: float = Field(600.0, gt=0)
    """How long a node holds a task before it returns to the pool."""

    max_leases_per_node: int = Field(3, ge=1, le=8)
    """Tasks one node may hold at once: one uploading, one generating, the next one lined up."""

    max_validation_backlog: int = Field(256, ge=1)
    """The most submissions awaiting validation plus tasks in progress a run ever has, whatever its
    measured throughput allows (:mod:`coordinator.services.admission`)."""

    backlog_floor: int = Field(16, ge=1)
    """Work that may always wait for validators (and for the trainer) whatever was measured: lets a
    run start, and keeps a slow start from starving."""

    throughput_window_s: float = Field(120.0, gt=0)
    """How far back the rate at which validators decide a run's submissions is measured."""

    backpressure_horizon_s: float = Field(60.0, gt=0)
    """How long new work is assumed to stay fresh before the trainer has published two policy steps
    (after that, ``async_level`` times the measured step period)."""

    trainer_live_s: float = Field(600.0, gt=0)
    """A trainer that read nothing for this long counts as gone: nodes are told why work stops."""

    island_lease_s: float = Field(300.0, gt=0)
    """A trainer island silent this long loses the accepted submissions it claimed but has not reported
    for an outer step: another island takes them."""

    min_node_version: str = "0.1.dev0"
    """Oldest node client version allowed to register and heartbeat."""

    chain_rpc_url: str | None = None
    """JSON-RPC URL of the EVM chain this deployment settles on; None: no settlement (the SQL
    ledger alone). Also advertised to nodes at ``/v1/public/chain`` for their claims."""

    chain_token: Address | None = None
    """The reward token's contract (what stakes and claims are paid in)."""

    chain_stake_registry: Address | None = None
    """The stake registry's contract; the coordinator's sender must hold its slasher role."""

    chain_distributor: Address | None = None
    """The credit distributor's contract; the coordinator's sender must hold its poster role."""

    chain_keystore: Path | None = None
    """Keystore of the coordinator's chain sender (it pays the gas for roots and slashes); its
    password comes from ``INTELLECT_CHAIN_PASSWORD``."""

    chain_from_block: int = Field(0, ge=0)
    """The block the contracts were deployed at: the coordinator reads their events (a root or a
    slash sent before a crash) from there on, since public RPCs refuse log ranges from genesis."""

    chain_confirmations: int = Field(1, ge=1, le=64)
    """Blocks that must hold a root's transaction before its epoch counts as anchored."""

    chain_cutoff_lag_s: int = Field(15, ge=0, le=3600)
    """How far an epoch's cutoff trails the coordinator's clock: the distributor refuses a cutoff
    later than the block that posts the root, and a chain's block times may trail ours."""

    epoch_s: float = Field(3600.0, gt=0)
    """How often an epoch closes: the tree of every address's cumulative final credit is built and
    its root posted (skipped when no final credit changed, so an idle network spends no gas)."""

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> CoordinatorSettings:
        if self.blob_store == "s3" and not self.s3_bucket:
            raise ValueError("blob_store s3 needs s3_bucket (INTELLECT_S3_BUCKET)")
        return self

    @model_validator(mode="after")
    def _settlement_needs_its_contracts(self) -> CoordinatorSettings:
        needed = {
            "chain_token": self.chain_token,
            "chain_stake_registry": self.chain_stake_registry,
            "chain_distributor": self.chain_distributor,
            "chain_keystore": self.chain_keystore,
        }
        missing = [f"INTELLECT_{name.upper()}" for name, value in needed.items() if value is None]
        if self.chain_rpc_url and missing:
            raise ValueError(f"settlement (chain_rpc_url) also needs {', '.join(missing)}")
        return self

    @property
    def chain(self) -> ChainSettings:
        """Where and as whom this deployment settles; raises ``ValueError`` on a deployment without a chain."""
        s = self
        if not (s.chain_rpc_url and s.chain_token and s.chain_stake_registry and s.chain_distributor and s.chain_keystore):
            raise ValueError("this coordinator does not settle on a chain (INTELLECT_CHAIN_RPC_URL is unset)")
        return ChainSettings(s.chain_rpc_url, s.chain_token, s.chain_stake_registry, s.chain_distributor, s.chain_keystore)

    @property
    def blob_root(self) -> Path:
        if self.blob_dir is not None:
            return self.blob_dir
        url = make_url(self.database_url)
        if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
            return Path(url.database).expanduser().resolve().parent / "blobs"
        return Path.home() / ".intellect" / "blobs"

    @property
    def header_limits(self) -> HeaderLimits:
        return HeaderLimits(self.header_timeout_s, self.max_header_bytes, self.max_connections_per_ip)

    @property
    def nonce_keep_s(self) -> int:
        return max(self.nonce_retention_s, 2 * self.signature_window_s)
