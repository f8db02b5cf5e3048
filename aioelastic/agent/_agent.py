"""The elastic agent: rendezvous, run the local workers, restart them, re-form when nodes change.

One loop, the shape of torchrun's ``SimpleElasticAgent._invoke_run`` but driven by events rather
than a monitor that polls every ``monitor_interval``::

    rendezvous -> spawn the local workers -> wait for the first of
        every worker exited 0        -> exit barrier, leave, SUCCEEDED
        a worker failed              -> stop the group; restart (re-rendezvous) or FAILED
        a membership change          -> stop the group gracefully, re-rendezvous
        the run was closed           -> stop the group, CLOSED
        stop requested (SIGTERM)     -> stop the group, leave, INTERRUPTED

The loop is a small state machine (:class:`_State`: JOIN, START, MONITOR, FAILURE, CHANGE,
EXIT), one method per state, each naming the next; the monitor's verdict is an
:class:`_Outcome` (an enum mypy checks every branch of, not a string).

A restart always goes through a new rendezvous round, as in torch: the failing node registers for
the next round, which the other members see as ``NODES_WAITING`` and follow, so the whole job
restarts together with a fresh ``MASTER_PORT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, assert_never

from anyio.abc import AsyncResource

from .. import _hints
from .. import events as _events
from .._secrets import split_password
from ..errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
)
from ..rendezvous import (
    RendezvousEvent,
    RendezvousEventKind,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousResult,
    create_handler,
    read_standby_round,
    store_url_for,
)
from ..timer import ExpiredTimer, SignalReaper, UnixTimerServer
from . import _tmpdirs
from ._secrets import auth_failure, worker_secret_env
from ._workers import Std, WorkerProcess, kill_groups, parse_std, spawn_worker, stop_workers
from .worker import ROUND_ENV, STORE_PREFIX_ENV, STORE_URL_ENV, TIMER_SOCKET_ENV

if TYPE_CHECKING:
    from ..events import EventSink
    from ._metrics import AgentMetrics, MetricsServer

__all__ = ["AgentState", "ElasticAgent", "RunResult", "WorkerFailure", "WorkerSpec"]

log = logging.getLogger("aioelastic.agent")

T = TypeVar("T")

#: seconds a join may take before the agent looks once whether this node is a standby
STANDBY_CHECK = 3.0
_DONE = "agent/done/"  # round-store keys: the nodes whose workers all succeeded
_WORKER_PREFIX = "w/"  # the workers' own namespace inside the round store


def _visible_device(local_rank: int) -> str:
    """``--virtual-local-rank``: the GPU of ``local_rank`` among the agent's visible devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(local_rank)
    devices = [d.strip() for d in visible.split(",")]
    if local_rank >= len(devices):
        raise ValueError(
            f"local rank {local_rank} has no device in CUDA_VISIBLE_DEVICES={visible!r}"
        )
    return devices[local_rank]


class AgentState(enum.Enum):
    """How a run ended."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CLOSED = "CLOSED"
    INTERRUPTED = "INTERRUPTED"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What to run on this node and how (torch's ``WorkerSpec`` plus the launcher's options).

    ``entrypoint`` is the full argv of a worker. ``redirects``/``tee`` take torchrun's forms
    (``3``, ``"0:1,1:2"``); log files go under ``log_dir`` (a temporary directory when output is
    redirected and no ``log_dir`` is given). ``stop_timeout`` is the grace between SIGTERM and
    SIGKILL when the agent stops its workers; ``exit_barrier_timeout`` how long a node whose
    workers all succeeded waits for the other nodes' workers before leaving.
    ``rendezvous_retry_timeout``: how long the agent keeps rejoining after the store was
    unreachable (``RendezvousConnectionError``: an etcd leader election, a restarted store
    server) before it gives up; 0 gives up at the first such error.
    ``loss_window``: a worker failure that comes with the loss of a node is that change's
    consequence (the survivors' workers fail on the broken collective), not a failure of the job:
    with no restart left, a failed node waits this long for a membership change before it fails
    (only when the round has other nodes; ``None``: the rendezvous lease's TTL + 1 s, by which a
    dead node's lease has expired); with restarts left, it restarts at once and the restart is
    not counted when the next round shows a node of the last one lost.
    ``local_ranks_filter`` (torchrun's ``--local-ranks-filter``): only these local ranks' output
    reaches the console (the others' log files are still written). ``virtual_local_rank``:
    ``LOCAL_RANK=0`` in every worker and ``CUDA_VISIBLE_DEVICES`` its one GPU, as torchrun's.
    """

    entrypoint: Sequence[str]
    nproc_per_node: int = 1
    max_restarts: int = 0
    role: str = "default"
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: str | None = None
    redirects: str | int = 0
    tee: str | int = 0
    stop_timeout: float = 30.0
    exit_barrier_timeout: float = 300.0
    monitor_interval: float = 0.1
    rendezvous_retry_timeout: float = 60.0
    loss_window: float | None = None
    local_ranks_filter: frozenset[int] | None = None
    virtual_local_rank: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.entrypoint, str) or not self.entrypoint:
            raise ValueError("entrypoint must be a non-empty sequence of argv strings")
        if not all(isinstance(a, str) for a in self.entrypoint):
            raise TypeError("entrypoint must hold only str")
        for name in ("nproc_per_node", "max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        for name in (
            "stop_timeout",
            "exit_barrier_timeout",
            "monitor_interval",
            "rendezvous_retry_timeout",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        window = self.loss_window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, (int, float)) or window < 0
        ):
            raise ValueError(f"loss_window must be a number of seconds >= 0, got {window!r}")
        parse_std(self.redirects, self.nproc_per_node, "redirects")
        parse_std(self.tee, self.nproc_per_node, "tee")
        if self.local_ranks_filter is not None and not all(
            isinstance(r, int) and 0 <= r < self.nproc_per_node for r in self.local_ranks_filter
        ):
            raise ValueError(f"local_ranks_filter: {self.local_ranks_filter!r} are not local ranks")


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """A worker that failed: which rank, how it ended, where its output is."""

    round: int
    rank: int
    local_rank: int
    pid: int
    exitcode: int
    log_path: str | None
    reaped_scope: str | None = None

    @property
    def signal_name(self) -> str | None:
        """``SIGKILL`` etc. when the worker died of a signal."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self) -> str:
        how = (
            f"exit code {self.exitcode}"
            if self.signal_name is None
            else f"killed by {self.signal_name}"
        )
        if self.reaped_scope is not None:
            how += f" (its watchdog timer {self.reaped_scope!r} expired)"
        where = self.log_path or "not captured (--redirects or --tee keeps it in a file)"
        return (
            f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid}, round "
            f"{self.round}): {how}; log: {where}"
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    """The outcome of :meth:`ElasticAgent.run`.

    ``failures`` are the failed workers of the last attempt (of every attempt in ``history``);
    ``restart_latencies`` the seconds from detecting a failure to the restarted workers running.
    """

    state: AgentState
    exit_code: int
    failures: tuple[WorkerFailure, ...] = ()
    history: tuple[WorkerFailure, ...] = ()
    restarts: int = 0
    rounds: int = 0
    message: str = ""
    restart_latencies: tuple[float, ...] = ()

    def summary(self) -> str:
        """A few lines a person can read: what happened and what failed where."""
        lines = [
            f"{self.state.value} (exit code {self.exit_code}) after {self.rounds} round(s), "
            f"{self.restarts} restart(s)" + (f": {self.message}" if self.message else "")
        ]
        lines += [f"  {failure.describe()}" for failure in self.failures]
        return "\n".join(lines)


#: Backoff between rejoins while the store is unreachable (seconds, doubling).
_RETRY_FIRST = 0.1
_RETRY_MAX = 2.0


class _Stop(Exception):
    """Internal: stop requested while waiting."""


class _State(enum.Enum):
    """The states of :meth:`ElasticAgent._run`; each has one method, which names the next::

        JOIN -> START -> MONITOR -> EXIT                        (succeeded, stopped)
                            |-----> FAILURE -> JOIN              (a restart left)
                            |          |------> CHANGE           (the failure followed a loss)
                            |          '------> EXIT             (no restart left)
                            '-----> CHANGE -> JOIN | EXIT        (re-form | the run was closed)

    JOIN and START go to EXIT when the rendezvous or the spawn cannot go on.
    """

    JOIN = "join"
    START = "start"
    MONITOR = "monitor"
    FAILURE = "failure"
    CHANGE = "change"
    EXIT = "exit"


class _Outcome(enum.Enum):
    """What ended one attempt (the workers of one round), as ``ElasticAgent._monitor`` saw it."""

    SUCCEEDED = "succeeded"  # every local worker exited 0
    STOPPED = "stopped"  # a stop was requested
    FAILED = "failed"  # a worker failed (and no loss of a node came with it)
    CHANGED = "changed"  # a membership change, the run closed, or a rendezvous error


@dataclass(frozen=True, slots=True)
class _Attempt:
    """An attempt's :class:`_Outcome` with its detail: the failures, or the change."""

    outcome: _Outcome
    failures: tuple[WorkerFailure, ...] = ()
    change: RendezvousEvent | BaseException | None = None


@dataclass(slots=True)
class _Run:
    """What a run carries from state to state."""

    handler: RendezvousHandler
    rdzv: RendezvousResult | None = None  # the round joined last
    failures: tuple[WorkerFailure, ...] = ()  # of the last failed attempt
    history: list[WorkerFailure] = field(default_factory=list)  # of every attempt
    change: RendezvousEvent | BaseException | None = None  # what CHANGE handles
    latencies: list[float] = field(default_factory=list)
    failed_at: float | None = None  # a failure or change was detected then: restart latency
    restart_reason: str | None = None
    restarted_from: RendezvousResult | None = None  # the round a counted restart left
    unreachable_since: float | None = None  # the store failed the joins since then
    backoff: float = _RETRY_FIRST
    joined_at: float = 0.0
    end: tuple[AgentState, int, str] | None = None  # what EXIT reports

    @property
    def round(self) -> RendezvousResult:
        assert self.rdzv is not None
        return self.rdzv

    def finish(self, state: AgentState, code: int, message: str = "") -> _State:
        self.end = (state, code, message)
        return _State.EXIT


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
        self._worker_store_secrets = bool(worker_store_secrets)
        self.event_sink: EventSink = _events.resolve_sink(event_sink)
        if metrics_port is not None:
            if isinstance(metrics_port, bool) or not isinstance(metrics_port, int):
                raise TypeError(f"metrics_port must be an int, got {type(metrics_port).__name__}")
            if not 0 <= metrics_port <= 65535:
                raise ValueError(f"metrics_port must be 0-65535, got {metrics_port}")
            from ._metrics import require_prometheus

            require_prometheus("metrics_port")
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host
        self.metrics: AgentMetrics | None = None
        self._metrics_server: MetricsServer | None = None
        self._redirects = parse_std(spec.redirects, spec.nproc_per_node, "redirects")
        self._tee = parse_std(spec.tee, spec.nproc_per_node, "tee")
        self._log_dir = spec.log_dir
        self._tmpdir: str | None = None
        self._timer_server: UnixTimerServer | None = None
        self._reaped: dict[int, str] = {}
        self._workers: list[WorkerProcess] = []
        self._stop_requested: asyncio.Event | None = None
        self._stop_signal: int | None = None
        self._stop_pending = False
        self._running = False
        self._closed = False
        self._node: str | None = None
        # observable progress
        self.round: int | None = None
        self.group_rank: int | None = None
        self.world_size: int | None = None
        self.restarts = 0
        self.rounds = 0

    def __repr__(self) -> str:
        return (
            f"<ElasticAgent round={self.round} world_size={self.world_size} "
            f"workers_up={self.workers_up} restarts={self.restarts}>"
        )

    # -- resource

    async def aclose(self) -> None:
        """Kill any worker left, stop the timer server, leave the rendezvous (idempotent)."""
        kill_groups(self._workers)
        if self._workers:
            await stop_workers(self._workers, 0)
            self._workers = []
        if self._closed:
            return
        self._closed = True
        metrics_server, self._metrics_server = self._metrics_server, None
        if metrics_server is not None:
            await metrics_server.aclose()
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
    def workers_up(self) -> int:
        """How many local workers are running now."""
        return sum(1 for w in self._workers if w.returncode is None)

    @property
    def timer_socket(self) -> str | None:
        """The path of the agent's timer server (set once :meth:`run` started)."""
        return None if self._timer_server is None else self._timer_server.path

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` while metrics are served (``metrics_port``), else None."""
        return None if self._metrics_server is None else self._metrics_server.url

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the current workers."""
        return [w.pid for w in self._workers]

    def request_stop(self, signum: int | None = None) -> None:
        """Stop the workers (SIGTERM, then SIGKILL after the grace) and end :meth:`run`.

        ``signum`` (the signal that asked) decides the exit code (128 + signum). A second request
        kills the workers at once.
        """
        if self._stop_signal is None or signum is not None:
            self._stop_signal = signum
        self._stop_pending = True
        if self._stop_requested is None:
            return
        if self._stop_requested.is_set():
            kill_groups(self._workers)
        self._stop_requested.set()

    # -- the run

    async def run(self) -> RunResult:
        """Run the job on this node until it succeeds, fails, is closed or is stopped."""
        if self._running or self._closed:
            raise RuntimeError("an ElasticAgent runs once")
        self._running = True
        self._stop_requested = asyncio.Event()
        if self._stop_pending:
            self._stop_requested.set()
        try:
            await self._start()
            return await self._run()
        finally:
            # whatever happened (an error, a cancellation): no worker survives the run
            kill_groups(self._workers)
            await self.aclose()

    async def _start(self) -> None:
        _tmpdirs.clean_stale_dirs()  # what SIGKILLed agents could not remove
        self._tmpdir = _tmpdirs.make_dir()
        if self._log_dir is None and any(
            self._redirects[r] | self._tee[r] for r in range(self.spec.nproc_per_node)
        ):
            # kept after the run (unlike the timer socket's directory): the summary points there
            self._log_dir = tempfile.mkdtemp(prefix="aioelastic-logs-")
            log.info("worker logs under %s", self._log_dir)
        run_id = self._params.run_id if self._params is not None else None
        if self._handler is not None:
            run_id = self._handler.run_id
        server = UnixTimerServer(
            os.path.join(self._tmpdir, "timer.sock"),
            reaper=self._reap_worker,
            event_sink=_events.ContextSink(self.event_sink, run_id=run_id),
        )
        await server.start()
        self._timer_server = server
        if self._handler is None:
            assert self._params is not None
            self._handler = await create_handler(self._params)
            if hasattr(self._handler, "event_sink"):  # ours: it reports where the agent does
                self._handler.event_sink = self.event_sink
        handler = self._handler
        self._node = getattr(handler, "node_id", None)
        if isinstance(server.event_sink, _events.ContextSink):
            server.event_sink.run_id, server.event_sink.node = handler.run_id, self._node
        if self._metrics_port is not None:
            from ._metrics import AgentMetrics, MetricsServer

            self.metrics = AgentMetrics(
                lambda: self.workers_up, run_id=handler.run_id, node=str(self._node or "")
            )
            metrics_server = MetricsServer(self.metrics, self._metrics_host, self._metrics_port)
            await metrics_server.start()
            self._metrics_server = metrics_server

    def _emit(self, kind: str, **fields: Any) -> None:
        handler = self._handler
        _events.emit(
            self.event_sink,
            kind,
            run_id=None if handler is None else handler.run_id,
            node=self._node,
            **fields,
        )

    _signal_reaper = SignalReaper()

    def _reap_worker(self, timer: ExpiredTimer) -> None:
        """The timer server's reaper: remember which scope expired, then SIGKILL the worker."""
        pid = timer.pid if timer.pid is not None else timer.worker_id
        if isinstance(pid, int):
            self._reaped[pid] = timer.scope_id
        self._emit("agent.worker_reaped", pid=pid, scope=timer.scope_id, round=self.round)
        log.warning("watchdog timer %r of worker pid %s expired: killing it", timer.scope_id, pid)
        self._signal_reaper(timer)

    async def _until_stop(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` unless a stop is requested first (then cancel it, raise _Stop)."""
        assert self._stop_requested is not None
        task = asyncio.ensure_future(awaitable)
        stopper = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
                await _settle(task)
        if task.cancelled() or not task.done():
            raise _Stop
        return task.result()

    async def _run(self) -> RunResult:
        """The state machine: each state does its work and names the next (see :class:`_State`)."""
        assert self._handler is not None
        run = _Run(self._handler)
        state = _State.JOIN
        while True:
            match state:
                case _State.JOIN:
                    state = await self._state_join(run)
                case _State.START:
                    state = await self._state_start(run)
                case _State.MONITOR:
                    state = await self._state_monitor(run)
                case _State.FAILURE:
                    state = await self._state_failure(run)
                case _State.CHANGE:
                    state = await self._state_change(run)
                case _State.EXIT:
                    return self._state_exit(run)
                case _:  # pragma: no cover - mypy proves every state is handled
                    assert_never(state)

    async def _state_join(self, run: _Run) -> _State:
        """JOIN: the next rendezvous round; START, or EXIT when the run cannot go on."""
        handler = run.handler
        try:
            log.info("joining rendezvous %r (%s)", handler.run_id, handler.get_backend())
            run.joined_at = asyncio.get_running_loop().time()
            rdzv = await self._until_stop(self._join(handler))
        except _Stop:
            return self._interrupted(run)
        except RendezvousGracefulExitError as exc:
            return run.finish(AgentState.CLOSED, 0, f"the run was closed: {exc}")
        except RendezvousClosedError as exc:
            hint = "" if self.rounds else f"; {_hints.CLOSED_RUN}"  # a stale run id
            return run.finish(AgentState.CLOSED, 1, f"the run was closed: {exc}{hint}")
        except RendezvousConnectionError as exc:
            return await self._unreachable(run, exc)
        except RendezvousError as exc:
            return run.finish(AgentState.FAILED, 1, f"rendezvous failed: {exc}")
        self._joined(run, rdzv)
        return _State.START

    async def _unreachable(self, run: _Run, exc: RendezvousConnectionError) -> _State:
        """The store is unreachable for now: rejoin (a new lease) until the budget is spent."""
        denied = auth_failure(exc)
        if denied is not None:  # no retry makes credentials right: fail now, say so
            return run.finish(
                AgentState.FAILED,
                1,
                f"rendezvous failed: the store refused our credentials: {denied} "
                "(http: give the token with --token-file or $AIOELASTIC_TOKEN; etcd: "
                "the user in the URL, the password with --password-file or "
                "$AIOELASTIC_ETCD_PASSWORD)",
            )
        spec = self.spec
        now = asyncio.get_running_loop().time()
        if run.unreachable_since is None:
            run.unreachable_since = now
            log.warning(
                "the rendezvous store at %s does not answer (%s); retrying until it "
                "does, for up to %.0f s (rendezvous_retry_timeout), then failing",
                self._store_url or run.handler.get_backend(),
                exc,
                spec.rendezvous_retry_timeout,
            )
        left = run.unreachable_since + spec.rendezvous_retry_timeout - now
        if left <= 0:
            return run.finish(
                AgentState.FAILED,
                1,
                f"rendezvous failed: {exc} (the store stayed unreachable for "
                f"rendezvous_retry_timeout={spec.rendezvous_retry_timeout}s)",
            )
        delay, run.backoff = min(run.backoff, left), min(run.backoff * 2, _RETRY_MAX)
        log.warning("rendezvous failed, rejoining in %.2fs: %s", delay, exc)
        self._emit("agent.rendezvous_retry", error=str(exc), delay=delay)
        try:
            await self._until_stop(asyncio.sleep(delay))  # a backoff, not a poll
        except _Stop:
            return self._interrupted(run)
        return _State.JOIN

    def _joined(self, run: _Run, rdzv: RendezvousResult) -> None:
        """A round was formed: the bookkeeping (refund, counters, metrics) and its log line."""
        spec = self.spec
        run.rdzv = rdzv
        run.unreachable_since, run.backoff = None, _RETRY_FIRST
        if run.restarted_from is not None:
            self._refund_restart(run.restarted_from, rdzv)
            run.restarted_from = None
        self.rounds += 1
        self.round, self.group_rank = rdzv.round, rdzv.rank
        self.world_size = rdzv.world_size * spec.nproc_per_node
        if self.metrics is not None:
            elapsed = asyncio.get_running_loop().time() - run.joined_at
            self.metrics.rendezvous_duration.observe(elapsed)
            self.metrics.round.set(rdzv.round)
            self.metrics.world_size.set(self.world_size)
            self.metrics.node_world_size.set(rdzv.world_size)
        log.info(
            "round %d: node rank %d of %d node(s), world size %d worker(s), restarts %d/%d",
            rdzv.round,
            rdzv.rank,
            rdzv.world_size,
            self.world_size,
            self.restarts,
            spec.max_restarts,
        )

    async def _state_start(self, run: _Run) -> _State:
        """START: spawn the local workers of the round; MONITOR, or EXIT when they cannot start."""
        rdzv = run.round
        try:
            await self._spawn(rdzv)
        except OSError as exc:
            return run.finish(AgentState.FAILED, 1, f"could not start the workers: {exc}")
        ranks = [w.rank for w in self._workers]
        self._emit(
            "agent.workers_started",
            round=rdzv.round,
            group_rank=rdzv.rank,
            world_size=self.world_size,
            ranks=ranks,
            pids=self.worker_pids,
            restarts=self.restarts,
        )
        if run.failed_at is not None:
            run.latencies.append(asyncio.get_running_loop().time() - run.failed_at)
            run.failed_at = None
            log.info("restarted in %.3f s", run.latencies[-1])
            self._emit(
                "agent.workers_restarted",
                round=rdzv.round,
                reason=run.restart_reason,
                restarts=self.restarts,
                max_restarts=self.spec.max_restarts,
                latency=round(run.latencies[-1], 6),
            )
        log.info(
            "round %d: %d worker(s) up (ranks %d-%d)",
            rdzv.round,
            len(ranks),
            min(ranks),
            max(ranks),
        )
        return _State.MONITOR

    async def _state_monitor(self, run: _Run) -> _State:
        """MONITOR: wait for what ends the attempt; each :class:`_Outcome` has its next state."""
        rdzv = run.round
        attempt = await self._monitor(rdzv)
        match attempt.outcome:
            case _Outcome.SUCCEEDED:
                log.info("round %d: all local workers succeeded", rdzv.round)
                await self._exit_barrier(rdzv)
                return run.finish(AgentState.SUCCEEDED, 0)
            case _Outcome.STOPPED:
                await self._stop_workers()
                return self._interrupted(run)
            case _Outcome.FAILED:
                run.failures = attempt.failures
                return _State.FAILURE
            case _Outcome.CHANGED:
                assert attempt.change is not None
                run.change = attempt.change
                return _State.CHANGE
            case _:  # pragma: no cover - mypy proves every outcome is handled
                assert_never(attempt.outcome)

    async def _state_failure(self, run: _Run) -> _State:
        """FAILURE: stop the group; a loss of a node explains it (CHANGE), else restart (JOIN)
        or, with no restart left, close the run (EXIT)."""
        spec, rdzv = self.spec, run.round
        run.failed_at = asyncio.get_running_loop().time()
        self._record_failures(run)
        await self._stop_workers()
        loss = None
        if self.restarts >= spec.max_restarts:
            loss = await self._loss_within(rdzv)
        if loss is not None:
            log.info(
                "round %d: the worker failure(s) followed %s: re-forming, not counted as a restart",
                rdzv.round,
                _describe_event(loss),
            )
            run.change = loss
            return _State.CHANGE
        if self.restarts >= spec.max_restarts:
            log.error("no restart left (max restarts %d): closing the run", spec.max_restarts)
            await self._close_run(run.handler)
            return run.finish(AgentState.FAILED, 1, f"max restarts ({spec.max_restarts}) exhausted")
        self.restarts += 1
        run.restarted_from = rdzv
        if self.metrics is not None:
            self.metrics.restarts.inc()
        run.restart_reason = "worker_failed"
        log.info("restarting the workers (%d/%d)", self.restarts, spec.max_restarts)
        return _State.JOIN

    def _record_failures(self, run: _Run) -> None:
        """The attempt's failures into the history, the log, the events and the metrics."""
        run.history.extend(run.failures)
        for failure in run.failures:
            log.error("worker failed: %s", failure.describe())
            self._emit(
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
            self.metrics.failures.inc(len(run.failures))

    async def _state_change(self, run: _Run) -> _State:
        """CHANGE: the membership changed (or the rendezvous failed): stop the group gracefully
        and re-rendezvous (JOIN); a closed run ends (EXIT)."""
        rdzv, event = run.round, run.change
        assert event is not None
        if isinstance(event, RendezvousEvent) and event.kind is RendezvousEventKind.CLOSED:
            log.info("round %d: the run was closed: stopping the workers", rdzv.round)
            await self._stop_workers()
            return run.finish(AgentState.CLOSED, 1, "the run was closed by another node")
        log.info(
            "round %d: %s: stopping the workers to re-rendezvous",
            rdzv.round,
            _describe_event(event),
        )
        run.failed_at = asyncio.get_running_loop().time()
        run.restart_reason = "membership_change"
        self._emit(
            "agent.membership_change",
            round=rdzv.round,
            change=_describe_event(event),
            event=event.kind.value if isinstance(event, RendezvousEvent) else "ERROR",
        )
        if self.metrics is not None:
            self.metrics.reformations.inc()
        await self._stop_workers()
        return _State.JOIN

    def _state_exit(self, run: _Run) -> RunResult:
        """EXIT: the run's result (and its ``agent.finished`` event)."""
        assert run.end is not None
        state, code, message = run.end
        self._emit(
            "agent.finished",
            state=state.value,
            exit_code=code,
            restarts=self.restarts,
            rounds=self.rounds,
            message=message,
        )
        return RunResult(
            state,
            code,
            run.failures,
            tuple(run.history),
            self.restarts,
            self.rounds,
            message,
            tuple(run.latencies),
        )

    def _interrupted(self, run: _Run) -> _State:
        sig = self._stop_signal
        code = 128 + sig if sig is not None else 1
        name = signal.Signals(sig).name if sig is not None else "a stop request"
        return run.finish(AgentState.INTERRUPTED, code, f"stopped by {name}")

    async def _join(self, handler: RendezvousHandler) -> RendezvousResult:
        """``next_rendezvous()``; if it is still waiting after :data:`STANDBY_CHECK` seconds, say
        once why when this node is a standby (one status read, not a poll)."""
        join = asyncio.ensure_future(handler.next_rendezvous())
        try:
            done, _ = await asyncio.wait({join}, timeout=STANDBY_CHECK)
            if not done:
                await self._explain_wait(handler)
            return await join
        finally:
            if not join.done():
                join.cancel()
                with contextlib.suppress(BaseException):
                    await join

    async def _explain_wait(self, handler: RendezvousHandler) -> None:
        """One read of the round record (O(1), not the run's every record): a full round without
        this node means it stands by."""
        store, node = getattr(handler, "store", None), getattr(handler, "node_id", None)
        max_nodes = getattr(handler, "max_nodes", None)
        if store is None or node is None or not isinstance(max_nodes, int):
            return  # a handler of someone else's: nothing to read
        try:
            standby = await read_standby_round(store, handler.run_id, node, max_nodes)
        except Exception:  # only an explanation: the join itself reports real errors
            return
        if standby is not None:
            log.info("standing by in rendezvous %r: %s", handler.run_id, _hints.STANDBY)
            self._emit("agent.standby", round=standby[0], members=standby[1])

    async def _close_run(self, handler: RendezvousHandler) -> None:
        try:
            await handler.set_closed()
        except RendezvousError as exc:
            log.warning("could not close the run: %s", exc)

    def _worker_env(self, rdzv: RendezvousResult, local_rank: int) -> dict[str, str]:
        spec = self.spec
        nproc = spec.nproc_per_node
        rank = rdzv.rank * nproc + local_rank
        world = rdzv.world_size * nproc
        env = dict(os.environ)
        config = self._params.config if self._params is not None else {}
        worker_secret_env(env, config, give_files=self._worker_store_secrets)
        env.update(spec.env)  # what the caller asks for explicitly wins
        if nproc > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = "1"  # as torchrun
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": str(rdzv.rank),
                "GROUP_WORLD_SIZE": str(rdzv.world_size),
                "ROLE_NAME": spec.role,
                "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(world),
                "MASTER_ADDR": rdzv.bootstrap_store_info.master_addr,
                "MASTER_PORT": str(rdzv.bootstrap_store_info.master_port),
                "TORCHELASTIC_RUN_ID": rdzv.run_id,
                "TORCHELASTIC_RESTART_COUNT": str(self.restarts),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
                "TORCHELASTIC_USE_AGENT_STORE": "False",
                ROUND_ENV: str(rdzv.round),
            }
        )
        if spec.virtual_local_rank:
            env["LOCAL_RANK"] = "0"
            env["CUDA_VISIBLE_DEVICES"] = _visible_device(local_rank)
        if self._timer_server is not None:
            env[TIMER_SOCKET_ENV] = self._timer_server.path
        prefix = getattr(rdzv.store, "prefix", None)
        if self._store_url is not None and isinstance(prefix, str):
            env[STORE_URL_ENV] = self._store_url
            env[STORE_PREFIX_ENV] = prefix + _WORKER_PREFIX
        return env

    async def _spawn(self, rdzv: RendezvousResult) -> None:
        spec = self.spec
        attempt_dir = None
        if self._log_dir is not None:
            attempt_dir = os.path.join(
                self._log_dir, f"{rdzv.run_id}", f"round_{rdzv.round}_{uuid.uuid4().hex[:6]}"
            )
        shown = spec.local_ranks_filter
        for local_rank in range(spec.nproc_per_node):
            quiet = shown is not None and local_rank not in shown
            redirect, tee = self._redirects[local_rank], self._tee[local_rank]
            worker = await spawn_worker(
                list(spec.entrypoint),
                self._worker_env(rdzv, local_rank),
                local_rank=local_rank,
                rank=rdzv.rank * spec.nproc_per_node + local_rank,
                log_dir=None if attempt_dir is None else os.path.join(attempt_dir, str(local_rank)),
                redirect=redirect | tee if quiet else redirect,  # as torchrun: files, no console
                tee=Std.NONE if quiet else tee,
                console=not quiet,
            )
            self._workers.append(worker)

    async def _stop_workers(self) -> None:
        workers, self._workers = self._workers, []
        try:
            sig = signal.SIGTERM if self._stop_signal is None else signal.Signals(self._stop_signal)
            await stop_workers(workers, self.spec.stop_timeout, sig)
        finally:
            kill_groups(workers)

    async def _next_change(self, rdzv: RendezvousResult) -> RendezvousEvent:
        """The next membership change that matters (a member that left done does not)."""
        handler = self._handler
        assert handler is not None
        while True:
            event = await handler.wait_for_change()
            if event.kind is RendezvousEventKind.PARTICIPANT_LOST and event.node_id is not None:
                with contextlib.suppress(Exception):
                    if await rdzv.store.get(_DONE + event.node_id) is not None:
                        log.info("node %s finished and left", event.node_id)
                        continue
            return event

    async def _monitor(self, rdzv: RendezvousResult) -> _Attempt:
        """Wait for the first thing that ends this attempt (no polling: exits and events)."""
        assert self._stop_requested is not None
        waiters: dict[asyncio.Task[Any], WorkerProcess] = {w.waiter: w for w in self._workers}
        changes = asyncio.ensure_future(self._next_change(rdzv))
        stopper = asyncio.ensure_future(self._stop_requested.wait())
        pending: set[asyncio.Future[Any]] = set(waiters)
        try:
            while True:
                done, _ = await asyncio.wait(
                    pending | {changes, stopper}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopper in done:
                    return _Attempt(_Outcome.STOPPED)
                exited = [waiters[t] for t in done if isinstance(t, asyncio.Task) and t in waiters]
                pending -= {w.waiter for w in exited}
                failed = [w for w in exited if w.returncode != 0]
                if failed and changes in done and _is_loss(changes):
                    # the failures are the loss's consequence
                    return _Attempt(_Outcome.CHANGED, change=changes.result())
                if failed:
                    failures = tuple(self._failure(rdzv, w) for w in failed)
                    return _Attempt(_Outcome.FAILED, failures=failures)
                if not pending:
                    return _Attempt(_Outcome.SUCCEEDED)
                if changes in done:
                    try:
                        return _Attempt(_Outcome.CHANGED, change=changes.result())
                    except RendezvousError as exc:
                        return _Attempt(_Outcome.CHANGED, change=exc)
        finally:
            for task in (changes, stopper):
                task.cancel()
            await _settle(changes, stopper)

    async def _loss_within(self, rdzv: RendezvousResult) -> RendezvousEvent | None:
        """The loss of a node of ``rdzv`` seen within the loss window, or None (see WorkerSpec)."""
        if len(rdzv.participants) < 2:
            return None  # nobody else to lose: the failure is the job's
        window = self.spec.loss_window
        if window is None:
            keeper = getattr(self._handler, "lease", None)
            ttl = getattr(keeper, "ttl", None)
            window = float(ttl) + 1.0 if isinstance(ttl, (int, float)) else 0.0
        if window <= 0:
            return None
        log.info(
            "round %d: waiting up to %.1f s for a membership change that would explain the failure",
            rdzv.round,
            window,
        )
        waiter = asyncio.ensure_future(self._next_loss(rdzv))
        try:
            await asyncio.wait({waiter}, timeout=window)
        finally:
            waiter.cancel()
            await _settle(waiter)
        return waiter.result() if waiter.done() and _is_loss(waiter) else None

    async def _next_loss(self, rdzv: RendezvousResult) -> RendezvousEvent:
        while True:
            event = await self._next_change(rdzv)
            if event.kind in (RendezvousEventKind.PARTICIPANT_LOST, RendezvousEventKind.CLOSED):
                return event

    def _refund_restart(self, left: RendezvousResult, rdzv: RendezvousResult) -> None:
        """A counted restart whose next round lacks a node of the round it left was the loss's
        consequence, not a failure of the job: give it back."""
        lost = sorted(set(left.participants) - set(rdzv.participants))
        if lost and self.restarts > 0:
            self.restarts -= 1
            log.info(
                "round %d: node(s) %s of round %d are gone: the failure was their loss's "
                "consequence, not counted as a restart",
                rdzv.round,
                ", ".join(lost),
                left.round,
            )

    def _failure(self, rdzv: RendezvousResult, worker: WorkerProcess) -> WorkerFailure:
        code = worker.returncode
        assert code is not None
        return WorkerFailure(
            round=rdzv.round,
            rank=worker.rank,
            local_rank=worker.local_rank,
            pid=worker.pid,
            exitcode=code,
            log_path=worker.stderr_path or worker.stdout_path,
            reaped_scope=self._reaped.pop(worker.pid, None),
        )

    async def _exit_barrier(self, rdzv: RendezvousResult) -> None:
        """Say this node is done; wait (bounded) for the others before leaving the round."""
        await self._stop_workers()  # reaps them and kills anything they left behind
        store = rdzv.store
        try:
            await store.put(_DONE + rdzv.node_id, b"1")
        except Exception as exc:  # best effort: leaving is what matters
            log.warning("exit barrier: could not record this node as done: %s", exc)
            return
        if rdzv.world_size == 1:
            return
        keys = [_DONE + node for node in rdzv.participants]
        wait = asyncio.ensure_future(store.wait_for(keys, timeout=self.spec.exit_barrier_timeout))
        changes = asyncio.ensure_future(self._next_change(rdzv))
        try:
            await self._until_stop(
                asyncio.wait([wait, changes], return_when=asyncio.FIRST_COMPLETED)
            )
        except _Stop:
            pass
        finally:
            for task in (wait, changes):
                task.cancel()
            await _settle(wait, changes)
        if wait.done() and not wait.cancelled() and wait.exception() is None:
            log.info("exit barrier: every node is done")
        else:
            log.info("exit barrier: leaving without waiting for every node")


def _is_loss(change: asyncio.Future[RendezvousEvent]) -> bool:
    """Whether a finished change future holds a lost participant."""
    if change.cancelled() or change.exception() is not None:
        return False
    return change.result().kind is RendezvousEventKind.PARTICIPANT_LOST


async def _settle(*tasks: asyncio.Future[Any]) -> None:
    """Wait for cancelled tasks to finish without taking their outcome (nor swallowing a
    cancellation of the caller, which ``suppress(CancelledError): await task`` would)."""
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" warning


def _describe_event(event: RendezvousEvent | BaseException) -> str:
    if isinstance(event, BaseException):
        return f"rendezvous error ({type(event).__name__}: {event})"
    what = event.kind.value
    if event.node_id is not None:
        what += f" ({event.node_id})"
    if event.num_nodes_waiting:
        what += f", {event.num_nodes_waiting} node(s) waiting"
    return what
