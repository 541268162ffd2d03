"""Prometheus metrics and the ASGI middleware that counts and times every request."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from intellect_protocol.shared.run_schemas import StepTiming


class Metrics:
    """One registry per app, so several apps in one process (tests) do not collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "intellect_http_requests", "HTTP requests handled", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "intellect_http_request_seconds",
            "HTTP request latency",
            ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.nodes = Gauge("intellect_nodes", "Nodes by status", ["status"], registry=self.registry)
        self.status_transitions = Counter(
            "intellect_node_status_transitions", "Status changes made by the status loop", registry=self.registry
        )
        self.step = Gauge("intellect_policy_step", "The last policy step with a timing, per run", ["run"], registry=self.registry)
        self.step_seconds = Gauge(
            "intellect_policy_step_seconds",
            "Where the last policy step's wall clock went, per run and phase",
            ["run", "phase"],
            registry=self.registry,
        )

    def record_step(self, run_id: str, timing: StepTiming) -> None:
        self.step.labels(run_id).set(timing.step)
        for phase, seconds in timing.model_dump().items():
            if phase.endswith("_s") and seconds is not None:
                self.step_seconds.labels(run_id, phase.removesuffix("_s")).set(seconds)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            # Label by route template, never by raw path, so scanners cannot blow up cardinality.
            name = getattr(route, "path", "unmatched")
            self.metrics.requests.labels(scope["method"], name, str(status)).inc()
            self.metrics.latency.labels(name).observe(time.perf_counter() - start)
