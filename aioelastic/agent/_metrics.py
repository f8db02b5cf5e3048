"""Prometheus metrics of an :class:`~aioelastic.agent.ElasticAgent`, served over HTTP on its loop.

``aioelastic run --metrics-port PORT`` (or ``ElasticAgent(metrics_port=...)``) serves
``GET /metrics`` in Prometheus' text format from a private ``CollectorRegistry`` (not the global
one, so several agents can share a process). The endpoint is an aiohttp site on the agent's own
event loop: no thread. prometheus-client is imported only here, only when metrics are asked for;
without it :func:`require_prometheus` raises an ``ImportError`` that names the extra to install.
Metric names and meanings are in ``docs/observability.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Self

from anyio.abc import AsyncResource

__all__ = ["AgentMetrics", "MetricsServer", "require_prometheus"]

log = logging.getLogger("aioelastic.agent")

#: Buckets of the rendezvous duration histogram, in seconds (a round takes ms to minutes).
RENDEZVOUS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def require_prometheus(flag: str = "metrics_port") -> None:
    """Raise ``ImportError`` naming ``flag`` and the extra to install if prometheus-client is
    missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"{flag} needs prometheus-client: pip install 'aioelastic[server]' "
            "(or pip install prometheus-client)"
        ) from exc


class AgentMetrics:
    """The agent's metrics in a registry of their own (see ``docs/observability.md``).

    ``workers_running`` is read when scraped, from ``workers_up``.
    """

    def __init__(self, workers_up: Callable[[], int], *, run_id: str, node: str) -> None:
        require_prometheus()
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

        registry = self.registry = CollectorRegistry(auto_describe=True)
        self.info = Info("aioelastic_agent", "The run and node of this agent", registry=registry)
        self.info.info({"run_id": run_id, "node": node})
        self.round = Gauge(
            "aioelastic_agent_rendezvous_round",
            "The rendezvous round the workers run in (-1 before the first)",
            registry=registry,
        )
        self.round.set(-1)
        self.world_size = Gauge(
            "aioelastic_agent_world_size",
            "WORLD_SIZE of the workers (nodes x workers per node; 0 before the first round)",
            registry=registry,
        )
        self.node_world_size = Gauge(
            "aioelastic_agent_nodes", "Nodes in the current round", registry=registry
        )
        self.restarts = Counter(
            "aioelastic_agent_restarts",
            "Restarts of the worker group after a worker failure",
            registry=registry,
        )
        self.reformations = Counter(
            "aioelastic_agent_membership_changes",
            "Times the workers were stopped to re-rendezvous after a membership change",
            registry=registry,
        )
        self.failures = Counter(
            "aioelastic_agent_worker_failures",
            "Workers that exited non-zero or died of a signal",
            registry=registry,
        )
        self.running = Gauge(
            "aioelastic_agent_workers_running", "Local workers running now", registry=registry
        )
        self.running.set_function(lambda: float(workers_up()))
        self.rendezvous_duration = Histogram(
            "aioelastic_agent_rendezvous_duration_seconds",
            "Time from joining the rendezvous to the round completing for this node",
            buckets=RENDEZVOUS_BUCKETS,
            registry=registry,
        )

    def render(self) -> tuple[bytes, str]:
        """The registry in Prometheus' text format, and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsServer(AsyncResource):
    """``GET /metrics`` for :class:`AgentMetrics` on ``host:port`` (0: a free port), in aiohttp.

    ``async with MetricsServer(metrics) as server:`` serves until the block ends (or
    :meth:`start`, then :meth:`aclose`)."""

    def __init__(self, metrics: AgentMetrics, host: str = "127.0.0.1", port: int = 0) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._runner: Any = None

    @property
    def url(self) -> str:
        """``http://host:port/metrics`` (the bound port once started)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def start(self) -> None:
        """Bind and serve; an address in use raises ``OSError``."""
        from aiohttp import web

        async def metrics(request: web.Request) -> web.Response:
            body, content_type = self.metrics.render()
            response = web.Response(body=body)
            response.headers["Content-Type"] = content_type
            return response

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        for address in runner.addresses:
            if isinstance(address, tuple):
                self.port = address[1]
                break
        log.info("agent metrics at %s", self.url)

    async def aclose(self) -> None:
        """Stop serving (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
