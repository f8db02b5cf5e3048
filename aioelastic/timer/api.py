"""The timer API: the wire record, the client and server ABCs, the guard, expires/configure.

A *timer* is a (worker, scope) pair with a deadline. A worker acquires it before a scope of work
and releases it after; if the deadline passes first, the :class:`TimerServer` *reaps* the worker
with its reaper (cancel a task, signal a process, call a callback) — exactly once, at the
deadline: every armed timer is a ``loop.call_at`` handle, never found by a periodic scan.

Clocks. In-process timers (:mod:`aioelastic.timer.local`) use event-loop time
(``loop.time()``), so a virtual-time loop reaps them without waiting. A timer that crosses a
process boundary travels as a :class:`TimerRequest` whose ``expiration_time`` is wall-clock
(``time.time()``, as torch's), because two processes share no loop clock; the server converts it
to a loop deadline on receipt: ``deadline = loop.time() + (expiration_time - time.time())``.
Across hosts this assumes synchronised wall clocks (NTP): clock skew shifts the reap by as much.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import math
import signal as _signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio

from .. import events as _events
from ..errors import TimerError, TimerExpiredError

if TYPE_CHECKING:
    from ..events import EventSink

__all__ = [
    "ExpiredTimer",
    "ReapEvent",
    "Reaper",
    "TimerClient",
    "TimerGuard",
    "TimerRequest",
    "TimerServer",
    "TimerServerStatistics",
    "configure",
    "expires",
    "get_client",
]

log = logging.getLogger("aioelastic.timer")

#: Version of the wire format (the ``"v"`` field of a JSON request).
WIRE_VERSION = 1
#: Longest accepted scope id / worker id on the wire, in characters.
MAX_ID_LENGTH = 1024
#: How long a guard waits for the release of its timer before giving up (the server then reaps).
RELEASE_TIMEOUT = 5.0

WorkerId = Hashable


# -- argument validation -------------------------------------------------------------------------


def check_duration(after: object, name: str = "after") -> float:
    """A finite number of seconds >= 0, else a ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(after, bool) or not isinstance(after, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(after).__name__}")
    if not math.isfinite(after) or after < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {after!r}")
    return float(after)


def check_scope_id(scope_id: object, name: str = "scope_id") -> str:
    if not isinstance(scope_id, str):
        raise TypeError(f"{name} must be a str, got {type(scope_id).__name__}")
    if not scope_id:
        raise ValueError(f"{name} must not be empty")
    if len(scope_id) > MAX_ID_LENGTH:
        raise ValueError(f"{name} is longer than {MAX_ID_LENGTH} characters")
    return scope_id


def check_signal(sig: object, name: str = "signal") -> int:
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise TypeError(f"{name} must be a signal number (int), got {type(sig).__name__}")
    if not 1 <= sig < _signal.NSIG:
        raise ValueError(f"{name} must be a signal number in 1..{_signal.NSIG - 1}, got {sig}")
    return int(sig)


def check_pid(pid: object, name: str = "pid") -> int:
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError(f"{name} must be a process id (int), got {type(pid).__name__}")
    if pid <= 0:
        raise ValueError(f"{name} must be a process id > 0, got {pid}")
    return pid


# -- the wire record -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimerRequest:
    """One timer request as it travels between processes (torch's ``TimerRequest``).

    ``expiration_time`` is wall-clock seconds since the epoch (``time.time()``); ``None`` (or,
    for torch compatibility, a negative number given to :meth:`from_json`) means *release*.
    ``worker_id`` is an ``int`` (a process id) or a ``str``; ``pid`` names the process a
    :class:`~aioelastic.timer.SignalReaper` signals when it is not the worker id itself;
    ``signal`` overrides the reaper's signal for this timer.
    """

    worker_id: int | str
    scope_id: str
    expiration_time: float | None
    pid: int | None = None
    signal: int | None = None

    def __post_init__(self) -> None:
        worker = self.worker_id
        if isinstance(worker, bool) or not isinstance(worker, (int, str)):
            raise TypeError(f"worker_id must be an int or a str, got {type(worker).__name__}")
        if isinstance(worker, str) and not worker:
            raise ValueError("worker_id must not be empty")
        if isinstance(worker, str) and len(worker) > MAX_ID_LENGTH:
            raise ValueError(f"worker_id is longer than {MAX_ID_LENGTH} characters")
        check_scope_id(self.scope_id)
        exp = self.expiration_time
        if exp is not None:
            if isinstance(exp, bool) or not isinstance(exp, (int, float)):
                raise TypeError(
                    f"expiration_time must be seconds since the epoch or None, "
                    f"got {type(exp).__name__}"
                )
            if not math.isfinite(exp) or exp < 0:
                raise ValueError(
                    f"expiration_time must be finite seconds since the epoch, got {exp!r}"
                )
        if self.pid is not None:
            check_pid(self.pid)
        if self.signal is not None:
            check_signal(self.signal)

    @property
    def is_release(self) -> bool:
        """True if this request releases the timer (no expiration)."""
        return self.expiration_time is None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this request (see :meth:`from_json`)."""
        data: dict[str, Any] = {
            "v": WIRE_VERSION,
            "worker": self.worker_id,
            "scope": self.scope_id,
            "expiration": self.expiration_time,
        }
        if self.pid is not None:
            data["pid"] = self.pid
        if self.signal is not None:
            data["signal"] = self.signal
        return data

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON, no newline: ``{"v":1,"worker":..,"scope":..,"expiration":..}``."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_dict(cls, data: object) -> TimerRequest:
        """Validate a decoded JSON object; raise ``ValueError`` saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"a timer request must be a JSON object, got {type(data).__name__}")
        version = data.get("v")
        if version != WIRE_VERSION:
            raise ValueError(f"unsupported timer request version {version!r} (expected 1)")
        unknown = set(data) - {"v", "worker", "scope", "expiration", "pid", "signal", "id"}
        if unknown:
            raise ValueError(f"unknown field(s) in timer request: {sorted(unknown)}")
        for required in ("worker", "scope", "expiration"):
            if required not in data:
                raise ValueError(f"timer request lacks the {required!r} field")
        exp = data["expiration"]
        if isinstance(exp, (int, float)) and not isinstance(exp, bool) and exp < 0:
            exp = None  # torch: a negative expiration means release
        try:
            return cls(data["worker"], data["scope"], exp, data.get("pid"), data.get("signal"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad timer request: {exc}") from None

    @classmethod
    def from_json(cls, raw: bytes | str) -> TimerRequest:
        """Parse and validate one JSON request; raise ``ValueError`` saying what is wrong."""
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"a timer request must be JSON: {exc}") from None
        return cls.from_dict(data)


# -- what reapers receive and what servers record -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExpiredTimer:
    """A timer whose deadline passed, as handed to a reaper.

    ``deadline`` is in the server's event-loop time; ``expiration_time`` is the wall-clock
    expiration the worker asked for when the timer came over a wire (else ``None``).
    """

    worker_id: WorkerId
    scope_id: str
    deadline: float
    expiration_time: float | None = None
    pid: int | None = None
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class ReapEvent:
    """The record of one reap: which timer, when (loop time), and how late after its deadline.

    ``error`` is the reaper's failure, if it raised (the timer still counts as reaped: it is
    never reaped twice).
    """

    timer: ExpiredTimer
    reaped_at: float
    lateness: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TimerServerStatistics:
    """A snapshot of a :class:`TimerServer`'s counters."""

    armed: int
    acquired: int
    released: int
    reaped: int
    reaper_failures: int
    rejected: int
    dropped: int


#: A reaper: called with each expired timer, exactly once; may return an awaitable.
Reaper = Callable[[ExpiredTimer], object]


# -- the client ----------------------------------------------------------------------------------


class TimerClient(abc.ABC):
    """Acquires and releases timers for one worker on a :class:`TimerServer`.

    ``acquire(scope_id, after)`` arms (or re-arms: a scope has one timer per worker) the scope's
    timer to expire ``after`` seconds from now; ``release(scope_id)`` disarms it (releasing an
    unknown or already reaped scope is not an error). Both are validated here, once, then passed
    to the transport's ``_acquire``/``_release``.
    """

    #: True if the server shares this process's event loop (``acquire`` takes loop time).
    in_process: bool = False

    async def acquire(self, scope_id: str, after: float) -> None:
        """Arm the timer of ``scope_id`` to expire ``after`` seconds from now."""
        check_scope_id(scope_id)
        after = check_duration(after)
        await self._acquire(scope_id, after)

    async def release(self, scope_id: str) -> None:
        """Disarm the timer of ``scope_id`` (no-op if it is not armed)."""
        check_scope_id(scope_id)
        await self._release(scope_id)

    async def aclose(self) -> None:  # noqa: B027 - an optional hook
        """Release the client's resources (connections); armed timers stay armed."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @abc.abstractmethod
    async def _acquire(self, scope_id: str, after: float) -> None: ...

    @abc.abstractmethod
    async def _release(self, scope_id: str) -> None: ...


# -- the server ----------------------------------------------------------------------------------


class _Armed:
    """One armed timer: its loop deadline, its ``call_at`` handle and what the reaper needs."""

    __slots__ = (
        "deadline",
        "expiration_time",
        "handle",
        "pid",
        "scope_id",
        "signal",
        "token",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: WorkerId,
        scope_id: str,
        deadline: float,
        expiration_time: float | None,
        pid: int | None,
        signal: int | None,
        token: object,
    ) -> None:
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.deadline = deadline
        self.expiration_time = expiration_time
        self.pid = pid
        self.signal = signal
        self.token = token
        self.handle: asyncio.TimerHandle | None = None


class TimerServer(abc.ABC):
    """Keeps the armed timers as ``loop.call_at`` deadlines and reaps each expired one once.

    An async resource: ``async with server:`` (or :meth:`start` / :meth:`aclose`). Its background
    work (accepting connections, watching the store, running async reapers) runs in an asyncio
    task the server owns, so it can be started and closed in different tasks. ``reaper`` is
    called with an :class:`ExpiredTimer` for every timer whose deadline passed before it was
    released; if it raises, the failure is logged and counted and the timer still counts as
    reaped. Every reap is logged (worker, scope, lateness) and recorded in :attr:`reaps` (the last
    ``history`` of them); :meth:`wait_reaped` waits for the next ones. The server never reaps its
    own process: that is up to the reaper, and :class:`~aioelastic.timer.SignalReaper` refuses.

    ``event_sink``: where a ``timer.reaped`` event goes for every reap (see
    :mod:`aioelastic.events`; default: ``AIOELASTIC_EVENTS``, else none); the attribute
    :attr:`event_sink` may be replaced.
    """

    def __init__(
        self, reaper: Reaper, *, history: int = 1000, event_sink: EventSink | None = None
    ) -> None:
        if not callable(reaper):
            raise TypeError(f"reaper must be callable, got {type(reaper).__name__}")
        if isinstance(history, bool) or not isinstance(history, int) or history < 0:
            raise ValueError(f"history must be an int >= 0, got {history!r}")
        self.reaper = reaper
        self.reaps: deque[ReapEvent] = deque(maxlen=history)
        self._timers: dict[tuple[WorkerId, str], _Armed] = {}
        self._by_worker: dict[WorkerId, set[str]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._children: set[asyncio.Task[None]] = set()
        # deadlines run in the server's context, not the acquiring worker's (and sharing one
        # context saves a copy per armed timer)
        self._context = contextvars.copy_context()
        self._reap_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._acquired = self._released = self._reaped = 0
        self._reaper_failures = self._rejected = self._dropped = 0
        #: where structured events go (see :mod:`aioelastic.events`)
        self.event_sink: EventSink = _events.resolve_sink(event_sink)

    # -- lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`aclose`."""
        return self._task is not None and not self._task.done() and not self._closed

    async def start(self) -> None:
        """Start the background task; return once the server accepts requests."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if self._task is not None:
            raise RuntimeError(f"{type(self).__name__} has already been started")
        loop = self._loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        task = self._task = loop.create_task(self._main(), name=f"aioelastic-{type(self).__name__}")
        try:
            await asyncio.wait([self._ready, task], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self.aclose()
            raise
        if not self._ready.done():
            self._closed = True
            task.result()  # raises what made it fail
            raise TimerError(f"{type(self).__name__} stopped while starting")
        task.add_done_callback(self._main_done)

    def _main_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s stopped: %s; armed timers still fire, but no new requests arrive",
                type(self).__name__,
                task.exception(),
                exc_info=task.exception(),
            )

    async def aclose(self) -> None:
        """Stop the server: disarm every timer (none is reaped after this), stop the task."""
        if self._closed:
            return
        self._closed = True
        for armed in self._timers.values():
            if armed.handle is not None:
                armed.handle.cancel()
        self._timers.clear()
        self._by_worker.clear()
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        children = list(self._children)  # spawned after the task ended, if it failed
        for child in children:
            child.cancel()
        if children:
            await asyncio.wait(children)
        self._wake_reap_waiters()
        await self._aclose()

    async def _main(self) -> None:
        try:
            await self._run(self._set_ready)
        finally:
            children = list(self._children)
            for child in children:
                child.cancel()
            if children:
                await asyncio.wait(children)

    def _set_ready(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``coro`` in a task owned by the server (cancelled when it stops)."""
        loop = self._loop
        assert loop is not None
        task = loop.create_task(coro, name=f"aioelastic-timer-{what}")
        self._children.add(task)
        task.add_done_callback(self._child_done)

    def _child_done(self, task: asyncio.Task[None]) -> None:
        self._children.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("timer server task %s failed", task.get_name(), exc_info=task.exception())

    @abc.abstractmethod
    async def _run(self, ready: Callable[[], None]) -> None:
        """The transport's background work; call ``ready()`` once requests are accepted.

        Runs in the server's task until cancelled by :meth:`aclose`; the tasks of async
        reapers (see :meth:`_spawn`) are cancelled when it ends.
        """

    async def _aclose(self) -> None:  # noqa: B027 - an optional hook
        """Release the transport's resources after the task stopped."""

    # -- what users read

    @property
    def armed(self) -> int:
        """How many timers are armed now."""
        return len(self._timers)

    def deadline_of(self, worker_id: WorkerId, scope_id: str) -> float | None:
        """The loop deadline of an armed timer, or ``None`` if it is not armed."""
        armed = self._timers.get((worker_id, scope_id))
        return None if armed is None else armed.deadline

    def statistics(self) -> TimerServerStatistics:
        return TimerServerStatistics(
            len(self._timers),
            self._acquired,
            self._released,
            self._reaped,
            self._reaper_failures,
            self._rejected,
            self._dropped,
        )

    async def wait_reaped(self, count: int = 1) -> list[ReapEvent]:
        """Wait until at least ``count`` reaps have happened in total; return the recorded ones."""
        while self._reaped < count:
            if self._closed:
                raise TimerError(
                    f"{type(self).__name__} closed after {self._reaped} of {count} reaps"
                )
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._reap_waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._reap_waiters:
                    self._reap_waiters.remove(waiter)
        return list(self.reaps)

    # -- the table (used by transports)

    def _require_running(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise TimerError(f"{type(self).__name__} is closed")
        if self._loop is None or self._task is None or self._task.done():
            raise TimerError(f"{type(self).__name__} is not running (use `async with server:`)")
        return self._loop

    def _arm(
        self,
        worker_id: WorkerId,
        scope_id: str,
        deadline: float,
        *,
        expiration_time: float | None = None,
        pid: int | None = None,
        signal: int | None = None,
        token: object = None,
    ) -> None:
        """Arm (or re-arm) the timer of (worker, scope) to fire at loop time ``deadline``."""
        loop = self._require_running()
        key = (worker_id, scope_id)
        old = self._timers.get(key)
        if old is not None and old.handle is not None:
            old.handle.cancel()
        armed = _Armed(worker_id, scope_id, deadline, expiration_time, pid, signal, token)
        armed.handle = loop.call_at(deadline, self._fire, armed, context=self._context)
        self._timers[key] = armed
        if old is None:
            self._by_worker.setdefault(worker_id, set()).add(scope_id)
        self._acquired += 1

    def _disarm(self, worker_id: WorkerId, scope_id: str, token: object = None) -> bool:
        """Disarm (worker, scope); with ``token``, only if it is still the same arming."""
        key = (worker_id, scope_id)
        armed = self._timers.get(key)
        if armed is None or (token is not None and armed.token != token):
            return False
        self._remove(armed)
        self._released += 1
        return True

    def _remove(self, armed: _Armed) -> None:
        if armed.handle is not None:
            armed.handle.cancel()
            armed.handle = None
        del self._timers[(armed.worker_id, armed.scope_id)]
        scopes = self._by_worker.get(armed.worker_id)
        if scopes is not None:
            scopes.discard(armed.scope_id)
            if not scopes:
                del self._by_worker[armed.worker_id]

    def _drop_worker(self, worker_id: WorkerId, reason: str) -> int:
        """Disarm every timer of a worker that is gone; return how many."""
        scopes = self._by_worker.get(worker_id)
        if not scopes:
            return 0
        count = 0
        for scope_id in list(scopes):
            armed = self._timers.get((worker_id, scope_id))
            if armed is not None:
                self._remove(armed)
                count += 1
        self._dropped += count
        log.info("dropped %d timer(s) of worker %s: %s", count, worker_id, reason)
        return count

    def _reject(self, what: str, why: object) -> None:
        """Log and count a rejected request; the server keeps running."""
        self._rejected += 1
        log.warning("rejected timer request %s: %s", what, why)

    def _fire(self, armed: _Armed) -> None:
        armed.handle = None
        if self._timers.get((armed.worker_id, armed.scope_id)) is not armed:
            return  # re-armed or released in the same loop iteration
        self._expire(armed)

    def _expire(self, armed: _Armed) -> None:
        """The deadline of ``armed`` passed: reap it (a transport may claim it first)."""
        self._remove(armed)
        self._reap(armed)

    def _reap(self, armed: _Armed) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        timer = ExpiredTimer(
            armed.worker_id,
            armed.scope_id,
            armed.deadline,
            armed.expiration_time,
            armed.pid,
            armed.signal,
        )
        lateness = now - armed.deadline
        self._reaped += 1
        log.warning(
            "reaping worker %s: timer of scope %r expired %.1f ms ago",
            armed.worker_id,
            armed.scope_id,
            lateness * 1000,
        )
        error: str | None = None
        try:
            result = self.reaper(timer)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._reaper_failures += 1
            log.exception(
                "reaper %r failed for worker %s scope %r",
                self.reaper,
                armed.worker_id,
                armed.scope_id,
            )
        else:
            if inspect.isawaitable(result):
                self._spawn(self._await_reaper(timer, result), "reaper")
        self.reaps.append(ReapEvent(timer, now, lateness, error))
        worker = armed.worker_id
        _events.emit(
            self.event_sink,
            "timer.reaped",
            server=type(self).__name__,
            worker=worker if isinstance(worker, (str, int)) else repr(worker),
            scope=armed.scope_id,
            pid=armed.pid,
            expiration_time=armed.expiration_time,
            lateness=round(lateness, 6),
            error=error,
        )
        self._wake_reap_waiters()

    def _wake_reap_waiters(self) -> None:
        waiters, self._reap_waiters = self._reap_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _await_reaper(self, timer: ExpiredTimer, result: Awaitable[object]) -> None:
        try:
            await result
        except Exception:
            self._reaper_failures += 1
            log.exception(
                "reaper %r failed for worker %s scope %r",
                self.reaper,
                timer.worker_id,
                timer.scope_id,
            )

    def _deadline_from_wall(self, expiration_time: float, wall: Callable[[], float]) -> float:
        """Convert a wall-clock expiration into a deadline on this server's loop."""
        loop = self._require_running()
        return loop.time() + (expiration_time - wall())


# -- the guard users hold around a block of work ---------------------------------------------------

_global_client: TimerClient | None = None


def configure(client: TimerClient | None) -> None:
    """Set the process-wide client :func:`expires` uses when none is passed (None: unset)."""
    global _global_client
    if client is not None and not isinstance(client, TimerClient):
        raise TypeError(f"client must be a TimerClient or None, got {type(client).__name__}")
    _global_client = client


def get_client() -> TimerClient | None:
    """The client set by :func:`configure`, if any."""
    return _global_client


def _caller_scope(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return f"{frame.f_code.co_filename}#{frame.f_lineno}"


class TimerGuard:
    """A watchdog timer around a block of work: ``async with expires(after=5): ...``.

    Entering arms the scope's timer on the client (so its server reaps the worker if the block
    hangs, even where this process cannot help itself: a blocked loop, a hung C call) and puts
    the block under a cancel scope with the same deadline, so a block that overruns while the
    loop runs is interrupted with :class:`~aioelastic.errors.TimerExpiredError`. Leaving in time
    — normally, by an exception, or cancelled from outside — releases the timer (in ``finally``,
    shielded). A block interrupted at its deadline does *not* release: the timer expired and the
    server reaps the worker, exactly once. Without a client (none passed, none configured) the
    guard is a local deadline only.

    Re-entering the same scope (recursion with the default ``file#line`` scope) replaces its
    timer on the server, as torch does. :meth:`cancel` stops the timer without reaping and lets
    the block run on unguarded. The guard is single-use.
    """

    def __init__(
        self,
        after: float,
        *,
        scope: str | None = None,
        client: TimerClient | None = None,
        _depth: int = 1,
    ) -> None:
        self.after = check_duration(after)
        self.scope_id = (
            check_scope_id(scope, "scope") if scope is not None else _caller_scope(_depth)
        )
        if client is not None and not isinstance(client, TimerClient):
            raise TypeError(f"client must be a TimerClient, got {type(client).__name__}")
        self.client = client if client is not None else _global_client
        self._deadline: float | None = None
        self._cancel_scope: anyio.CancelScope | None = None
        self._state = "new"  # new | armed | released | cancelled | expired

    def __repr__(self) -> str:
        return f"<TimerGuard scope={self.scope_id!r} after={self.after} {self._state}>"

    @property
    def state(self) -> str:
        """``new``, ``armed``, ``released``, ``cancelled`` (by :meth:`cancel`) or ``expired``."""
        return self._state

    @property
    def deadline(self) -> float | None:
        """The loop time the block must finish by (``None`` before :meth:`acquire`)."""
        return self._deadline

    @property
    def remaining(self) -> float:
        """Seconds left before the deadline (``after`` before acquire, 0 once expired, ``inf``
        once cancelled)."""
        if self._deadline is None:
            return self.after
        if self._state == "expired":
            return 0.0
        if self._state == "cancelled":
            return math.inf
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def expires(self) -> float:
        """Seconds left before the deadline (same as :attr:`remaining`)."""
        return self.remaining

    @property
    def expired(self) -> bool:
        return self._state == "expired"

    async def acquire(self) -> None:
        """Arm the timer on the client; the deadline counts from now."""
        if self._state != "new":
            raise RuntimeError(f"this timer guard is {self._state}; guards are single-use")
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self.after
        if self.client is not None:
            try:
                await self.client.acquire(self.scope_id, self.after)
            except asyncio.CancelledError:
                # the request may have reached the server: disarm it, or this worker would be
                # reaped for a block it never ran
                self._state = "released"
                with contextlib.suppress(Exception):
                    await self._send_release()
                raise
        self._state = "armed"

    async def release(self) -> None:
        """Disarm the timer: the work is done (no-op unless armed)."""
        if self._state != "armed":
            return
        self._state = "released"
        await self._send_release()

    async def cancel(self) -> None:
        """Stop the timer without reaping; the rest of the block runs without a deadline."""
        if self._state != "armed":
            return
        self._state = "cancelled"
        if self._cancel_scope is not None:
            self._cancel_scope.deadline = math.inf
        await self._send_release()

    async def _send_release(self) -> None:
        if self.client is None:
            return
        if self.client.in_process:
            # an in-process release completes without suspending, so it cannot be interrupted
            await self.client.release(self.scope_id)
            return
        with anyio.move_on_after(RELEASE_TIMEOUT, shield=True) as scope:
            await self.client.release(self.scope_id)
        if scope.cancelled_caught:
            log.warning("release of timer scope %r timed out", self.scope_id)

    async def __aenter__(self) -> Self:
        await self.acquire()
        assert self._deadline is not None
        cancel_scope = anyio.CancelScope(deadline=self._deadline)
        cancel_scope.__enter__()
        self._cancel_scope = cancel_scope
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        cancel_scope = self._cancel_scope
        assert cancel_scope is not None
        try:
            swallowed = bool(cancel_scope.__exit__(exc_type, exc, tb))
        finally:
            if cancel_scope.cancelled_caught and self._state == "armed":
                self._state = "expired"
            else:
                await self.release()
        if self._state == "expired" and cancel_scope.cancelled_caught:
            raise TimerExpiredError(
                f"timer of scope {self.scope_id!r} expired: the block ran past {self.after}s"
            ) from None
        return swallowed


def expires(
    after: float, scope: str | None = None, client: TimerClient | None = None
) -> TimerGuard:
    """A :class:`TimerGuard`: ``async with expires(after=5): ...`` must finish within 5 s.

    ``scope`` defaults to the caller's ``"file#line"`` (so recursion re-arms one timer);
    ``client`` defaults to the one set by :func:`configure` (none: a local deadline only).
    """
    return TimerGuard(after, scope=scope, client=client, _depth=2)


def wall_clock() -> float:
    """The clock of wire expirations: ``time.time()``."""
    return time.time()
