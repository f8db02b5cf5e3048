"""The server's Prometheus metrics (``/metrics``), or none without prometheus-client."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..memory import MemoryEngine
from ._errors import ApiError

__all__ = ["NoMetrics", "ServerMetrics", "metrics_for"]

log = logging.getLogger("aioelastic.serve")


class ServerMetrics:
    """Prometheus metrics of one server, in a registry of its own (several servers can share a
    process)."""

    def __init__(self, engine: MemoryEngine) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "aioelastic_requests",
            "HTTP requests answered, by operation and status code",
            ["op", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "aioelastic_request_duration_seconds",
            "Time to answer a request (a watch: the stream's lifetime), by operation",
            ["op"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30, 300),
            registry=self.registry,
        )
        self.keys = Gauge("aioelastic_keys", "Keys in the store", registry=self.registry)
        self.keys.set_function(lambda: len(engine))
        self.leases = Gauge("aioelastic_leases", "Live leases", registry=self.registry)
        self.leases.set_function(lambda: engine.lease_count)
        self.revision = Gauge("aioelastic_revision", "Store revision", registry=self.registry)
        self.revision.set_function(lambda: engine.revision)
        self.watchers = Gauge(
            "aioelastic_watch_streams",
            "Open watch streams and session watches",
            registry=self.registry,
        )
        self.connections = Gauge(
            "aioelastic_connections", "Open client connections", registry=self.registry
        )
        self.sessions = Gauge(
            "aioelastic_sessions", "Connected sessions (/v1/session)", registry=self.registry
        )
        self._refused = Counter(
            "aioelastic_connections_refused",
            "Connections over --max-connections, by what became of them: silent_closed (an "
            "idle connection closed to make room), over_limit (answered /healthz or 503)",
            ["reason"],
            registry=self.registry,
        )
        self._log_events = Counter(
            "aioelastic_log_events",
            "Log lines suppressed by the one-line-a-second limit (suppressed), and errors for "
            "lack of file descriptors, EMFILE/ENFILE (fd_exhausted)",
            ["event"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}

    def observe(self, op: str, status: int, seconds: float) -> None:
        children = self._children.get((op, status))
        if children is None:
            children = self._children[(op, status)] = (
                self.requests.labels(op, str(status)),
                self.latency.labels(op),
            )
        children[0].inc()
        children[1].observe(seconds)

    def refused(self, reason: str) -> None:
        self._refused.labels(reason).inc()

    def log_event(self, event: str) -> None:
        self._log_events.labels(event).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Unset:
    def set_function(self, function: Callable[[], float]) -> None:
        pass


class NoMetrics:
    """Without prometheus-client the server runs as usual; ``/metrics`` answers 501 and says
    which extra to install."""

    watchers = connections = sessions = _Unset()

    def observe(self, op: str, status: int, seconds: float) -> None:
        pass

    def refused(self, reason: str) -> None:
        pass

    def log_event(self, event: str) -> None:
        pass

    def render(self) -> tuple[bytes, str]:
        raise ApiError(
            501,
            "metrics_unavailable",
            "this server has no metrics: install prometheus-client (pip install "
            "'aioelastic[server]') and restart it",
        )


def metrics_for(engine: MemoryEngine) -> ServerMetrics | NoMetrics:
    try:
        return ServerMetrics(engine)
    except ImportError:
        log.info("prometheus-client is not installed: /metrics is disabled")
        return NoMetrics()
