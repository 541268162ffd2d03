"""Every coordinator setting in one place, read from ``INTELLECT_*`` env vars or a TOML file: those of the
node-facing protocol at the top level, the rest grouped by concern (:mod:`coordinator.setting_groups`)
under the same variable names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource
from sqlalchemy import make_url

from intellect_protocol.coordinator.setting_groups import (
    FLAT,
    GROUPS,
    AdmissionSettings,
    ChainSettings,
    CommitteeSettings,
    LimitSettings,
    S3Settings,
    nest,
)
from intellect_protocol.shared.schemas import Address
from intellect_protocol.shared.settings import RoleSettings

ENV_PREFIX = "INTELLECT_"


class _Nested(PydanticBaseSettingsSource):
    """Another source's flat settings with the grouped ones moved into their groups."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self.inner = inner

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # noqa: ARG002 (unused: __call__ reads all)
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return nest(self.inner())


class _NestedToml(TomlConfigSettingsSource):
    """The TOML file, its grouped settings moved into their groups."""

    def __call__(self) -> dict[str, Any]:
        return nest(super().__call__())


class _GroupedEnv(PydanticBaseSettingsSource):
    """The grouped settings' environment variables, by their flat names (``INTELLECT_VALIDATOR_LIVE_S``)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # noqa: ARG002
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        environ = {name.upper(): value for name, value in os.environ.items() if name.upper().startswith(ENV_PREFIX)}
        found = {flat: environ[f"{ENV_PREFIX}{flat.upper()}"] for flat in FLAT if f"{ENV_PREFIX}{flat.upper()}" in environ}
        return nest(found)


class CoordinatorSettings(RoleSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, toml_file="intellect-coordinator.toml", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003 (pydantic-settings passes every source by name)
        file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # As every role's: flags (the constructor's keywords) beat variables, which beat the TOML file;
        # each may name a grouped setting by its flat name.
        return _Nested(settings_cls, init_settings), env_settings, _GroupedEnv(settings_cls), _NestedToml(settings_cls)

    limits: LimitSettings = Field(default_factory=LimitSettings)
    """What one client may send (rates, sizes, times, registrations)."""

    s3: S3Settings = Field(default_factory=S3Settings)
    """The S3-compatible blob store, when ``blob_store`` is ``s3``."""

    committee: CommitteeSettings = Field(default_factory=CommitteeSettings)
    """Validator committees: assignment, liveness, strikes, appeals."""

    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    """How much new work a run hands out."""

    chain: ChainSettings = Field(default_factory=ChainSettings)
    """Settlement on an EVM chain (none by default)."""

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

    blob_store: Literal["local", "s3"] = "local"
    """Where rollout files are kept: ``local`` (a directory, ``blob_dir``) or ``s3`` (a bucket of an
    S3-compatible service, :attr:`s3`)."""

    blob_dir: Path | None = None
    """Directory of the local blob store that keeps rollout files; by default ``blobs/`` beside the
    SQLite ledger, or ``~/.intellect/blobs`` with PostgreSQL."""

    relay_ttl_s: float = Field(90.0, gt=0)
    """A relay not heard from for this long drops out of the list clients download from."""

    manifest_wait_max_s: float = Field(30.0, ge=0, le=300)
    """Longest a long-poll for new manifests may hold its request open."""

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

    task_lease_s: float = Field(600.0, gt=0)
    """How long a node holds a task before it returns to the pool."""

    max_leases_per_node: int = Field(3, ge=1, le=8)
    """Tasks one node may hold at once: one uploading, one generating, the next one lined up."""

    plugin_failures_to_pause: int = Field(20, ge=1)
    """Reward failures of a run's environment, reported by nodes and reproduced here, after which the coordinator
    pauses the run (saying why on its status) until an operator resumes it."""

    plugin_failure_reporters_to_pause: int = Field(3, ge=1)
    """Nodes the failures that pause a run must come from (every node not banned, where fewer are registered): one
    node feeding the reward a text it crashes on, lease after lease, cannot pause a run alone."""

    island_lease_s: float = Field(300.0, gt=0)
    """A trainer island silent this long loses the accepted submissions it claimed but has not reported
    for an outer step: another island takes them."""

    min_node_version: str = "0.1.dev0"
    """Oldest node client version allowed to register and heartbeat."""

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> CoordinatorSettings:
        """A copy with ``update`` applied, grouped settings named by their flat names too, as the
        constructor takes them (unvalidated, as pydantic's own copy)."""
        nested = nest(update or {})
        for group in GROUPS:
            if group in nested and isinstance(nested[group], dict):
                nested[group] = getattr(self, group).model_copy(update=nested[group])
        return super().model_copy(update=nested, deep=deep)

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> CoordinatorSettings:
        if self.blob_store == "s3" and not self.s3.bucket:
            raise ValueError("blob_store s3 needs s3_bucket (INTELLECT_S3_BUCKET)")
        return self

    @property
    def blob_root(self) -> Path:
        if self.blob_dir is not None:
            return self.blob_dir
        url = make_url(self.database_url)
        if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
            return Path(url.database).expanduser().resolve().parent / "blobs"
        return Path.home() / ".intellect" / "blobs"

    @property
    def nonce_keep_s(self) -> int:
        return max(self.nonce_retention_s, 2 * self.signature_window_s)
