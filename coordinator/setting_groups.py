"""The coordinator's settings that belong together, one model per concern; :class:`CoordinatorSettings`
holds each as a field (``settings.committee.validator_live_s``). Every one keeps the environment variable,
TOML key and constructor keyword it had as a flat setting (``INTELLECT_VALIDATOR_LIVE_S``, ``s3_bucket``,
``chain_rpc_url``): :data:`FLAT` maps those names to their group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from intellect_protocol.shared.schemas import Address
from intellect_protocol.shared.serving import HeaderLimits


class Group(BaseModel):
    """A group's fields are read by their own names or by the flat names they had (their aliases)."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, extra="forbid")


class LimitSettings(Group):
    """What one client may send: request rates, body and header sizes and times, registrations."""

    rate_limit_per_s: float = Field(20.0, gt=0)
    """Sustained requests per second allowed to one address (or one client IP when unsigned)."""

    rate_limit_burst: int = Field(60, ge=1)
    """Requests one address may send at once before the sustained rate applies."""

    aggregate_reads_per_s: float = Field(2.0, gt=0)
    """Sustained reads per second one client IP may make of the public aggregates (throughput, leaderboard,
    validators): answers of up to hundreds of KB, which the page reads three of every 5 s. Within
    ``rate_limit_per_s``, not beside it."""

    aggregate_reads_burst: int = Field(20, ge=1)
    """Reads of the public aggregates one client IP may make at once before their sustained rate applies."""

    max_body_bytes: int = Field(1 << 20, ge=1024)
    """Largest request body accepted; larger ones get 413 before they are read."""

    max_upload_bytes: int = Field(64 << 20, ge=1024)
    """Largest rollout file a node may upload."""

    max_pseudo_gradient_bytes: int = Field(4 << 30, ge=1024)
    """Largest pseudo-gradient an island may upload for an audit: 2 bytes a parameter (bf16), so 4 GiB holds a 2B
    model's. Only a drawn audit's exact bytes are stored; the staging disk must hold one per trainer at once."""

    max_body_bytes_in_flight: int = Field(1 << 30, ge=1 << 20)
    """Most request-body bytes the coordinator admits at once, over every client: a body counts at
    its declared length (a chunked one at its limit) until its answer is sent, and a request that
    would pass this gets 503 with Retry-After before a byte is read. Rollout uploads do not count: they
    are streamed to disk, each signer within its own share. Bounds memory under a flood of bodies from
    many addresses (buffered bodies cost about twice this at worst)."""

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

    registrations_per_ip_per_hour: int = Field(20, ge=1)
    """New node addresses one client network (:attr:`registration_prefix_v4`, :attr:`registration_prefix_v6`)
    may register per hour (a burst of this many, then evenly spread): a banned cheater's next wallet costs it
    time. Registering an address again is free."""

    newcomer_uploads_per_s: float = Field(1.0, gt=0)
    """Files per second that nodes with no accepted file yet may upload from one client network (the registration
    prefixes), all together, after a burst of one node's leases (``max_leases_per_node``); beyond it, 429 with the
    time to retry, before a byte of the body is read. Fresh wallets' files then arrive at this pace however many
    there are, and a proven node is never held to it."""

    registration_prefix_v4: int = Field(24, ge=8, le=32)
    """IPv4 clients in one /N share one registration allowance: ten addresses of one /24 registered 200
    wallets in 8 s when each address had its own (32: each address its own)."""
    registration_prefix_v6: int = Field(56, ge=16, le=128)
    """IPv6 clients in one /N share one registration allowance: one host commonly holds a whole /64, and a
    site a /56, so an allowance per address would be no limit at all."""

    @property
    def header_limits(self) -> HeaderLimits:
        return HeaderLimits(self.header_timeout_s, self.max_header_bytes, self.max_connections_per_ip)


class S3Settings(Group):
    """The ``s3`` blob store (``blob_store = "s3"``); credentials from the usual ``AWS_*`` variables or ``~/.aws``."""

    bucket: str | None = Field(None, validation_alias="s3_bucket")
    """The bucket of the ``s3`` blob store (it must exist)."""

    prefix: str = Field("", validation_alias="s3_prefix")
    """Key prefix under which this deployment's rollout files go, to share a bucket."""

    endpoint_url: str | None = Field(None, validation_alias="s3_endpoint_url")
    """The S3-compatible service, e.g. ``http://minio:9000``; None: AWS S3 itself."""

    region: str | None = Field(None, validation_alias="s3_region")
    """The bucket's region, where the service needs one."""


class CommitteeSettings(Group):
    """Who judges submissions and how long they have: assignment, liveness, strikes, appeals."""

    validation_claim_s: float = Field(300.0, gt=0)
    """How long a validator has to answer an assignment before it is drawn again."""

    validator_live_s: float = Field(120.0, gt=0)
    """Work is assigned only to validators that asked for work within this long. Long enough to
    cover an honest validator's busiest batch: a validator that asks more often gets no more of it."""

    unassignable_retry_s: float = Field(5.0, gt=0)
    """A review no live validator could be drawn for is not drawn for again before this long: work
    nobody can judge yet (a hold, a thin committee) never crowds out work somebody can."""

    unproven_share: float = Field(1 / 3, gt=0, le=1)
    """The most of the live validators (at least one) that check files of addresses with no accepted file at once,
    appeals and second looks included: a flood of fresh wallets' files leaves the others free for proven nodes'
    work. New nodes' first files wait for those validators in turn."""

    newcomer_reviews_per_s: float = Field(5.0, gt=0)
    """Reviews of files of addresses with no accepted file (first looks, second looks, appeals) handed to validators
    per second at most, by each coordinator process (bursts of one second's worth): however many fresh wallets
    upload, the work they cost validators and the coordinator is bounded, and proven nodes' work keeps its latency.
    They are handed in order of arrival, so a new honest node's file waits behind the files that came before it."""

    validator_max_strikes: int = Field(3, ge=1)
    """Times a validator may be outvoted by the majority (since it was granted the role) before the
    role is revoked and its recent verdicts are checked again."""

    recheck_window_s: float = Field(86400.0, ge=0)
    """How far back a revoked validator's verdicts are voided and their submissions judged again."""

    appeals_per_day: int = Field(3, ge=0)
    """Appeals one node may file per 24 hours (each costs validators at least two model passes)."""


class AdmissionSettings(Group):
    """How much new work a run hands out: as fast as validators decide it and the trainer reads it
    (:mod:`coordinator.services.admission`)."""

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


@dataclass(frozen=True)
class ChainDeployment:
    """Where and as whom a deployment that settles on a chain does so: every part present."""

    rpc_url: str
    token: str
    stake_registry: str
    distributor: str
    keystore: Path


class ChainSettings(Group):
    """Settlement on an EVM chain; no ``rpc_url``: none (the SQL ledger alone)."""

    rpc_url: str | None = Field(None, validation_alias="chain_rpc_url")
    """JSON-RPC URL of the EVM chain this deployment settles on; None: no settlement (the SQL
    ledger alone). Also advertised to nodes at ``/v1/public/chain`` for their claims."""

    token: Address | None = Field(None, validation_alias="chain_token")
    """The reward token's contract (what stakes and claims are paid in)."""

    stake_registry: Address | None = Field(None, validation_alias="chain_stake_registry")
    """The stake registry's contract; the coordinator's sender must hold its slasher role."""

    distributor: Address | None = Field(None, validation_alias="chain_distributor")
    """The credit distributor's contract; the coordinator's sender must hold its poster role."""

    keystore: Path | None = Field(None, validation_alias="chain_keystore")
    """Keystore of the coordinator's chain sender (it pays the gas for roots and slashes); its
    password comes from ``INTELLECT_CHAIN_PASSWORD``."""

    from_block: int = Field(0, ge=0, validation_alias="chain_from_block")
    """The block the contracts were deployed at: the coordinator reads their events (a root or a
    slash sent before a crash) from there on, since public RPCs refuse log ranges from genesis."""

    confirmations: int = Field(1, ge=1, le=64, validation_alias="chain_confirmations")
    """Blocks that must hold a root's transaction before its epoch counts as anchored."""

    cutoff_lag_s: int = Field(15, ge=0, le=3600, validation_alias="chain_cutoff_lag_s")
    """How far an epoch's cutoff trails the coordinator's clock: the distributor refuses a cutoff
    later than the block that posts the root, and a chain's block times may trail ours."""

    epoch_s: float = Field(3600.0, gt=0)
    """How often an epoch closes: the tree of every address's cumulative final credit is built and
    its root posted (skipped when no final credit changed, so an idle network spends no gas)."""

    @model_validator(mode="after")
    def _settlement_needs_its_contracts(self) -> ChainSettings:
        needed = {
            "token": self.token,
            "stake_registry": self.stake_registry,
            "distributor": self.distributor,
            "keystore": self.keystore,
        }
        missing = [f"INTELLECT_CHAIN_{name.upper()}" for name, value in needed.items() if value is None]
        if self.rpc_url and missing:
            raise ValueError(f"settlement (chain_rpc_url) also needs {', '.join(missing)}")
        return self

    def deployed(self) -> ChainDeployment:
        """Where and as whom this deployment settles; raises ``ValueError`` on a deployment without a chain."""
        if not (self.rpc_url and self.token and self.stake_registry and self.distributor and self.keystore):
            raise ValueError("this coordinator does not settle on a chain (INTELLECT_CHAIN_RPC_URL is unset)")
        return ChainDeployment(self.rpc_url, self.token, self.stake_registry, self.distributor, self.keystore)


GROUPS: dict[str, type[Group]] = {
    "limits": LimitSettings,
    "s3": S3Settings,
    "committee": CommitteeSettings,
    "admission": AdmissionSettings,
    "chain": ChainSettings,
}
"""Each group's field name on :class:`CoordinatorSettings`, and its model."""

FLAT: dict[str, tuple[str, str]] = {
    (field.validation_alias if isinstance(field.validation_alias, str) else name): (group, name)
    for group, model in GROUPS.items()
    for name, field in model.model_fields.items()
}
"""Every grouped setting's flat name (its environment variable less ``INTELLECT_``): its group and its name there."""


def nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat settings (a TOML file's keys, constructor keywords) with the grouped ones moved into their groups."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        if key in FLAT:
            group, name = FLAT[key]
            nested.setdefault(group, {})[name] = value
        else:
            nested[key] = value
    return nested
