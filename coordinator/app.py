"""The coordinator's FastAPI app factory."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import cache

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute

from intellect_protocol.coordinator.anchoring import Anchorer
from intellect_protocol.coordinator.blobs import BlobStore, LocalBlobStore, S3BlobStore
from intellect_protocol.coordinator.body_limit import BodyLimitMiddleware, PerClientLimitMiddleware
from intellect_protocol.coordinator.clock import Clock, system_clock
from intellect_protocol.coordinator.context import Context
from intellect_protocol.coordinator.db import (
    make_engine,
    make_sessionmaker,
    read_audience,
    require_migrated,
)
from intellect_protocol.coordinator.errors import install_error_handlers
from intellect_protocol.coordinator.ledger import Ledger
from intellect_protocol.coordinator.loops import Loop
from intellect_protocol.coordinator.metrics import Metrics, MetricsMiddleware
from intellect_protocol.coordinator.routers import (
    admin,
    appeals,
    health,
    nodes,
    page,
    public,
    settlement,
    shardcast,
    tasks,
    training,
    validation,
)
from intellect_protocol.coordinator.services import nodes as node_service
from intellect_protocol.coordinator.services.nonces import prune_nonces
from intellect_protocol.coordinator.services.rate_limit import RateLimiter
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.stakes import StakeBook
from intellect_protocol.shared.version import __version__

ROUTERS = (nodes, tasks, validation, appeals, training, shardcast, admin, public, settlement, health, page)


@cache
def api_routes() -> tuple[BaseRoute, ...]:
    """Every router's routes, built once a process. Including a router makes FastAPI analyse each endpoint's
    signature and models anew (0.1 s of CPU an app, which tests build hundreds of); the routes hold nothing of
    an app (handlers reach its context through the request), so the apps of a process share them. What that
    gives up: an app's ``dependency_overrides`` do not reach them, and nothing overrides a dependency."""
    api = APIRouter()
    for module in ROUTERS:
        api.include_router(module.router)
    return tuple(api.routes)


def create_app(settings: CoordinatorSettings | None = None, clock: Clock = system_clock) -> FastAPI:
    """Build the app; raises ``NotMigratedError`` on a database that is not at the head revision. ``clock``:
    what the ledger's times and deadlines are read from (:mod:`coordinator.clock`)."""
    settings = settings or CoordinatorSettings()
    engine = make_engine(settings.database_url)
    require_migrated(engine, settings.database_url)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        audience = settings.audience or read_audience(session)
    metrics = Metrics()

    def status_tick() -> None:
        with sessions.begin() as session:
            changed = node_service.evaluate_statuses(session, settings, clock())
            prune_nonces(session, datetime.now(UTC), settings.nonce_keep_s)  # nonces keep to the signature window's wall clock
        metrics.status_transitions.inc(changed)
        with sessions() as session:
            for status, count in node_service.status_counts(session).items():
                metrics.nodes.labels(status).set(count)

    loops = [Loop("node-status", settings.status_loop_interval_s, status_tick)]
    anchorer = stakes = None
    if settings.chain.rpc_url:
        anchorer = Anchorer(sessions, settings)
        stakes = StakeBook(anchorer.chain)
        loops.append(Loop("anchoring", min(settings.chain.epoch_s, 5.0), anchorer.tick))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for loop in loops:
            loop.start()
        yield
        for loop in loops:
            loop.stop()
        ledger.close()
        engine.dispose()

    app = FastAPI(
        title="Intellect Protocol coordinator",
        version=__version__,
        lifespan=lifespan,
        description="Assigns work to nodes, verifies their signed requests, and keeps the ledger.",
    )
    hourly = settings.limits.registrations_per_ip_per_hour
    app.state.context = Context(
        settings=settings,
        engine=engine,
        ledger=(ledger := Ledger(sessions, threads=0 if engine.dialect.name == "sqlite" else settings.db_threads, clock=clock)),
        audience=audience,
        metrics=metrics,
        blobs=blob_store(settings),
        loops=loops,
        rate_limiter=RateLimiter(settings.limits.rate_limit_per_s, settings.limits.rate_limit_burst),
        registration_limiter=RateLimiter(hourly / 3600, hourly),
        aggregate_limiter=RateLimiter(settings.limits.aggregate_reads_per_s, settings.limits.aggregate_reads_burst),
        newcomer_uploads=RateLimiter(settings.limits.newcomer_uploads_per_s, settings.max_leases_per_node),
        newcomer_reviews=RateLimiter(newcomers := settings.committee.newcomer_reviews_per_s, math.ceil(newcomers)),
        anchorer=anchorer,
        stakes=stakes,
    )

    install_error_handlers(app)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.limits.max_body_bytes,
        overrides={
            "/v1/submissions": settings.limits.max_upload_bytes,
            "/v1/trainer/pseudo-gradients": settings.limits.max_pseudo_gradient_bytes,
        },
        idle_timeout_s=settings.limits.body_idle_timeout_s,
        deadline_s=settings.limits.body_deadline_s,
        budget_bytes=settings.limits.max_body_bytes_in_flight,
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(PerClientLimitMiddleware, max_in_flight=settings.limits.max_requests_per_ip)
    app.router.routes.extend(api_routes())
    app.mount("/static", page.static, name="static")
    return app


def blob_store(settings: CoordinatorSettings) -> BlobStore:
    if settings.blob_store == "s3":
        if settings.s3.bucket is None:
            raise ValueError("blob_store s3 needs s3_bucket (INTELLECT_S3_BUCKET)")
        return S3BlobStore(
            settings.s3.bucket, prefix=settings.s3.prefix, endpoint_url=settings.s3.endpoint_url, region=settings.s3.region
        )
    return LocalBlobStore(settings.blob_root)
