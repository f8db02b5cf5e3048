"""What the agent reports as its run goes: the ``agent.*`` structured events (see
:mod:`aioelastic.events`), the Prometheus metrics when they are served (``_metrics.py``) and the
log lines that go with them, one method per happening."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import events as _events
from ..rendezvous import RendezvousEvent, RendezvousResult
from ._membership import describe_event
from ._progress import RunProgress
from ._result import WorkerFailure

if TYPE_CHECKING:
    from ..events import EventSink
    from ._metrics import AgentMetrics, MetricsServer

__all__ = ["AgentTelemetry"]

log = logging.getLogger("aioelastic.agent")


class AgentTelemetry:
    """The events of one agent (stamped with its ``run_id`` and ``node`` once known) and its
    metrics (``metrics`` is None unless :meth:`serve_metrics` was called)."""

    def __init__(self, sink: EventSink, progress: RunProgress) -> None:
        self.sink = sink
        self.progress = progress
        self.run_id: str | None = None
        self.node: str | None = None
        self.metrics: AgentMetrics | None = None
        self._server: MetricsServer | None = None

    def emit(self, kind: str, **fields: Any) -> None:
        _events.emit(self.sink, kind, run_id=self.run_id, node=self.node, **fields)

    # -- metrics

    @property
    def metrics_url(self) -> str | None:
        return None if self._server is None else self._server.url

    async def serve_metrics(self, workers_up: Callable[[], int], host: str, port: int) -> None:
        from ._metrics import AgentMetrics, MetricsServer

        assert self.run_id is not None
        self.metrics = AgentMetrics(workers_up, run_id=self.run_id, node=str(self.node or ""))
        server = MetricsServer(self.metrics, host, port)
        await server.start()
        self._server = server

    async def aclose(self) -> None:
        """Stop serving the metrics (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            await server.aclose()

    # -- the run's happenings

    def joined(self, rdzv: RendezvousResult, elapsed: float) -> None:
        """A round formed ``elapsed`` seconds after the join began."""
        progress = self.progress
        if self.metrics is not None:
            self.metrics.rendezvous_duration.observe(elapsed)
            self.metrics.round.set(rdzv.round)
            self.metrics.world_size.set(progress.world_size or 0)
            self.metrics.node_world_size.set(rdzv.world_size)
        log.info(
            "round %d: node rank %d of %d node(s), world size %d worker(s), restarts %d/%d",
            rdzv.round,
            rdzv.rank,
            rdzv.world_size,
            progress.world_size,
            progress.restarts,
            progress.max_restarts,
        )

    def workers_started(
        self, rdzv: RendezvousResult, ranks: list[int], pids: list[int], latency: float | None
    ) -> None:
        """The round's workers run (``latency``: since the failure or change, on a restart)."""
        progress = self.progress
        self.emit(
            "agent.workers_started",
            round=rdzv.round,
            group_rank=rdzv.rank,
            world_size=progress.world_size,
            ranks=ranks,
            pids=pids,
            restarts=progress.restarts,
        )
        if latency is not None:
            log.info("restarted in %.3f s", latency)
            self.emit(
                "agent.workers_restarted",
                round=rdzv.round,
                reason=progress.restart_reason,
                restarts=progress.restarts,
                max_restarts=progress.max_restarts,
                latency=round(latency, 6),
            )
        log.info(
            "round %d: %d worker(s) up (ranks %d-%d)",
            rdzv.round,
            len(ranks),
            min(ranks),
            max(ranks),
        )

    def workers_failed(self, failures: tuple[WorkerFailure, ...]) -> None:
        for failure in failures:
            log.error("worker failed: %s", failure.describe())
            self.emit(
                "agent.worker_failed",
                round=failure.round,
                rank=failure.rank,
                local_rank=failure.local_rank,
                pid=failure.pid,
                exitcode=failure.exitcode,
                signal=failure.signal_name,
                reaped_scope=failure.reaped_scope,
                log_path=failure.log_path,
            )
        if self.metrics is not None:
            self.metrics.failures.inc(len(failures))

    def restart_counted(self) -> None:
        if self.metrics is not None:
            self.metrics.restarts.inc()
        log.info(
            "restarting the workers (%d/%d)", self.progress.restarts, self.progress.max_restarts
        )

    def membership_change(
        self, rdzv: RendezvousResult, event: RendezvousEvent | BaseException
    ) -> None:
        """The workers stop to re-rendezvous after ``event``."""
        self.emit(
            "agent.membership_change",
            round=rdzv.round,
            change=describe_event(event),
            event=event.kind.value if isinstance(event, RendezvousEvent) else "ERROR",
        )
        if self.metrics is not None:
            self.metrics.reformations.inc()

    def finished(self, state: str, code: int, message: str) -> None:
        self.emit(
            "agent.finished",
            state=state,
            exit_code=code,
            restarts=self.progress.restarts,
            rounds=self.progress.rounds,
            message=message,
        )
