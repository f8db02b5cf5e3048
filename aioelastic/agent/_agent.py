"""The elastic agent: rendezvous, run the local workers, restart them, re-form when nodes change.

One loop, the shape of torchrun's ``SimpleElasticAgent._invoke_run`` but driven by events rather
than a monitor that polls every ``monitor_interval``::

    rendezvous -> spawn the local workers -> wait for the first of
        every worker exited 0        -> exit barrier, leave, SUCCEEDED
        a worker failed              -> stop the group; restart (re-rendezvous) or FAILED
        a membership change          -> stop the group gracefully, re-rendezvous
        the run was closed           -> stop the group, CLOSED
        stop requested (SIGTERM)     -> stop the group, leave, INTERRUPTED

A restart always goes through a new rendezvous round, as in torch: the failing node registers for
the next round, which the other members see as ``NODES_WAITING`` and follow, so the whole job
restarts together with a fresh ``MASTER_PORT``.

:class:`ElasticAgent` is the resource that owns the run's parts; each part is a module of its own:

- ``_run_loop.py``: the loop as a state machine (JOIN, START, MONITOR, FAILURE, CHANGE, EXIT), one
  method per state, each naming the next;
- ``_monitor.py``: what ends one attempt, as an ``Outcome`` enum mypy checks every branch of;
- ``_membership.py``: the rendezvous side (join, standby, membership changes, the loss window,
  the exit barrier);
- ``_group.py``, ``_worker_env.py``, ``_workers.py``: the local workers, their environment, their
  processes;
- ``_progress.py``: rounds, restarts (and the refund of a restart a loss caused), rejoin backoff;
- ``_telemetry.py``: the ``agent.*`` events, the metrics and their log lines;
- ``_stops.py``: the stop request and the waits it cuts short;
- ``_spec.py``, ``_result.py``: what to run, and how the run ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import TYPE_CHECKING

from anyio.abc import AsyncResource

from .. import events as _events
from .._secrets import split_password
from ..errors import RendezvousError
from ..rendezvous import (
    RendezvousHandler,
    RendezvousParameters,
    create_handler,
    store_url_for,
)
from ..timer import ExpiredTimer, SignalReaper, UnixTimerServer
from . import _tmpdirs
from ._group import WorkerGroup
from ._membership import Membership
from ._progress import RunProgress
from ._result import AgentState, RunResult, WorkerFailure
from ._run_loop import RunLoop
from ._spec import WorkerSpec
from ._stops import StopRequest
from ._telemetry import AgentTelemetry
from ._worker_env import WorkerEnvironment

if TYPE_CHECKING:
    from ..events import EventSink
    from ._metrics import AgentMetrics

__all__ = ["AgentState", "ElasticAgent", "RunResult", "WorkerFailure", "WorkerSpec"]

log = logging.getLogger("aioelastic.agent")


class ElasticAgent(AsyncResource):
    """Runs one node's workers of an elastic job: ``result = await agent.run()``.

    ``rendezvous`` is a :class:`~aioelastic.rendezvous.RendezvousParameters` (the agent creates
    the handler and leaves the rendezvous when done) or a ready handler (left open).
    ``store_url`` is passed to the workers (``AIOELASTIC_STORE_URL``, without any password); by
    default it is the rendezvous store's URL when that store is reachable from other processes.
    The workers get no secret in their environment (``AIOELASTIC_TOKEN`` and
    ``AIOELASTIC_ETCD_PASSWORD`` are removed); with ``worker_store_secrets`` (the default) they
    get the paths of the rendezvous config's ``token_file``/``password_file`` as
    ``AIOELASTIC_TOKEN_FILE``/``AIOELASTIC_ETCD_PASSWORD_FILE`` (see ``agent/_secrets.py``).

    ``event_sink`` receives the agent's structured events (``agent.*``), those of the rendezvous
    handler it creates (a handler passed in keeps its own sink) and of its timer server (see
    :mod:`aioelastic.events`; default: ``AIOELASTIC_EVENTS``, else none). ``metrics_port`` serves
    Prometheus metrics at ``http://metrics_host:metrics_port/metrics`` while the agent runs (0: a
    free port, see :attr:`metrics_url`; needs prometheus-client, the ``server`` extra).

    An async resource: ``async with ElasticAgent(...) as agent`` closes everything (timer server,
    rendezvous, workers: SIGKILL to their process groups) whatever happens. :meth:`request_stop`
    (what SIGTERM/SIGINT handlers call) stops the workers gracefully and ends :meth:`run`.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        rendezvous: RendezvousParameters | RendezvousHandler,
        *,
        store_url: str | None = None,
        event_sink: EventSink | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        worker_store_secrets: bool = True,
    ) -> None:
        if not isinstance(spec, WorkerSpec):
            raise TypeError(f"spec must be a WorkerSpec, got {type(spec).__name__}")
        if not isinstance(rendezvous, (RendezvousParameters, RendezvousHandler)):
            raise TypeError(
                "rendezvous must be RendezvousParameters or a RendezvousHandler, got "
                f"{type(rendezvous).__name__}"
            )
        self.spec = spec
        self._params = rendezvous if isinstance(rendezvous, RendezvousParameters) else None
        self._handler = rendezvous if isinstance(rendezvous, RendezvousHandler) else None
        self._owns_handler = self._handler is None
        if store_url is None and self._params is not None:
            url = store_url_for(self._params)
            store_url = None if url.startswith("memory:") else url
        self._store_url = split_password(store_url)[0] if store_url is not None else None
        if metrics_port is not None:
            if isinstance(metrics_port, bool) or not isinstance(metrics_port, int):
                raise TypeError(f"metrics_port must be an int, got {type(metrics_port).__name__}")
            if not 0 <= metrics_port <= 65535:
                raise ValueError(f"metrics_port must be 0-65535, got {metrics_port}")
            from ._metrics import require_prometheus

            require_prometheus("metrics_port")
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host
        environment = WorkerEnvironment(
            spec,
            self._params.config if self._params is not None else {},
            give_files=bool(worker_store_secrets),
            store_url=self._store_url,
        )
        self._group = WorkerGroup(spec, environment)
        self._progress = RunProgress(spec.nproc_per_node, spec.max_restarts)
        self._telemetry = AgentTelemetry(_events.resolve_sink(event_sink), self._progress)
        if self._handler is not None:
            self._telemetry.run_id = self._handler.run_id
        self._stop = StopRequest()
        self._tmpdir: str | None = None
        self._timer_server: UnixTimerServer | None = None
        self._running = False
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"<ElasticAgent round={self.round} world_size={self.world_size} "
            f"workers_up={self.workers_up} restarts={self.restarts}>"
        )

    # -- resource

    async def aclose(self) -> None:
        """Kill any worker left, stop the timer server, leave the rendezvous (idempotent)."""
        await self._group.reap_all()
        if self._closed:
            return
        self._closed = True
        await self._telemetry.aclose()
        server, self._timer_server = self._timer_server, None
        if server is not None:
            await server.aclose()
        if self._handler is not None and self._owns_handler:
            with contextlib.suppress(RendezvousError):
                await self._handler.aclose()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # -- observable state

    @property
    def event_sink(self) -> EventSink:
        """Where the agent's structured events go."""
        return self._telemetry.sink

    @property
    def metrics(self) -> AgentMetrics | None:
        """The agent's Prometheus metrics while they are served (``metrics_port``), else None."""
        return self._telemetry.metrics

    @property
    def round(self) -> int | None:
        """The rendezvous round joined last (None before the first)."""
        return self._progress.round

    @property
    def group_rank(self) -> int | None:
        """This node's rank in that round."""
        return self._progress.group_rank

    @property
    def world_size(self) -> int | None:
        """``WORLD_SIZE`` of the workers of that round (nodes x workers per node)."""
        return self._progress.world_size

    @property
    def restarts(self) -> int:
        """Restarts counted so far (of ``spec.max_restarts``)."""
        return self._progress.restarts

    @property
    def rounds(self) -> int:
        """Rounds joined so far."""
        return self._progress.rounds

    @property
    def workers_up(self) -> int:
        """How many local workers are running now."""
        return self._group.up

    @property
    def timer_socket(self) -> str | None:
        """The path of the agent's timer server (set once :meth:`run` started)."""
        return None if self._timer_server is None else self._timer_server.path

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` while metrics are served (``metrics_port``), else None."""
        return self._telemetry.metrics_url

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the current workers."""
        return self._group.pids

    def request_stop(self, signum: int | None = None) -> None:
        """Stop the workers (SIGTERM, then SIGKILL after the grace) and end :meth:`run`.

        ``signum`` (the signal that asked) decides the exit code (128 + signum). A second request
        kills the workers at once.
        """
        if self._stop.request(signum):
            self._group.kill()

    # -- the run

    async def run(self) -> RunResult:
        """Run the job on this node until it succeeds, fails, is closed or is stopped."""
        if self._running or self._closed:
            raise RuntimeError("an ElasticAgent runs once")
        self._running = True
        self._stop.arm()
        try:
            handler = await self._start()
            loop = RunLoop(
                self.spec,
                Membership(handler, self._telemetry.emit),
                self._group,
                self._progress,
                self._telemetry,
                self._stop,
                self._store_url or handler.get_backend(),
            )
            return await loop.run()
        finally:
            # whatever happened (an error, a cancellation): no worker survives the run
            self._group.kill()
            await self.aclose()

    async def _start(self) -> RendezvousHandler:
        """The run's resources: its folders, the timer server, the handler, the metrics."""
        _tmpdirs.clean_stale_dirs()  # what SIGKILLed agents could not remove
        self._tmpdir = _tmpdirs.make_dir()
        self._group.prepare_log_dir()
        server = UnixTimerServer(
            os.path.join(self._tmpdir, "timer.sock"),
            reaper=self._reap_worker,
            event_sink=_events.ContextSink(self.event_sink, run_id=self._run_id()),
        )
        await server.start()
        self._timer_server = server
        self._group.environment.timer_socket = server.path
        handler = await self._open_handler()
        node = self._telemetry.node = getattr(handler, "node_id", None)
        self._telemetry.run_id = handler.run_id
        if isinstance(server.event_sink, _events.ContextSink):
            server.event_sink.run_id, server.event_sink.node = handler.run_id, node
        if self._metrics_port is not None:
            await self._telemetry.serve_metrics(
                lambda: self.workers_up, self._metrics_host, self._metrics_port
            )
        return handler

    def _run_id(self) -> str | None:
        if self._handler is not None:
            return self._handler.run_id
        return self._params.run_id if self._params is not None else None

    async def _open_handler(self) -> RendezvousHandler:
        """The handler given, or one made from the parameters (its events go where ours do)."""
        if self._handler is None:
            assert self._params is not None
            self._handler = await create_handler(_without_roster(self._params))
            if hasattr(self._handler, "event_sink"):  # ours: it reports where the agent does
                self._handler.event_sink = self.event_sink
        return self._handler

    _signal_reaper = SignalReaper()

    def _reap_worker(self, timer: ExpiredTimer) -> None:
        """The timer server's reaper: remember which scope expired, then SIGKILL the worker."""
        pid = timer.pid if timer.pid is not None else timer.worker_id
        if isinstance(pid, int):
            self._group.reaped(pid, timer.scope_id)
        self._telemetry.emit("agent.worker_reaped", pid=pid, scope=timer.scope_id, round=self.round)
        log.warning("watchdog timer %r of worker pid %s expired: killing it", timer.scope_id, pid)
        self._signal_reaper(timer)


def _without_roster(params: RendezvousParameters) -> RendezvousParameters:
    """``params`` with ``participants`` off unless they set it: the agent needs no member list
    (a restart's refund reads the round record's ``departed`` count), and reading the roster
    costs every member O(N) bytes a round, O(N^2) in all."""
    if "participants" in params.config:
        return params
    config = {**params.config, "participants": False}
    return RendezvousParameters(
        params.backend,
        params.endpoint,
        params.run_id,
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        **config,
    )
