"""Timers across hosts through any :class:`~aioelastic.store.Store` backend.

A timer is a key ``{prefix}{worker}/{scope}`` (both percent-encoded) whose value is the
:class:`~aioelastic.timer.TimerRequest` JSON with its wall-clock ``expiration``; acquiring puts
the key, releasing deletes it. The server reads the prefix, then watches it from the next
revision, and schedules each timer on its loop (``loop.call_at``) — no scans. At a deadline it
*claims* the timer with ``compare_and_delete(key, mod_revision)`` and reaps only if the claim
succeeded: a release (or a re-acquire) that reached the store first wins, and two servers
watching one prefix never reap the same timer twice. Only the ``Store`` protocol is used, so
this works on every backend (memory, http, etcd).

A worker may bind its timers to its lease (``lease=``): when the worker dies its lease expires
and its timers vanish (dropped, not reaped). That trades detection of a *hung* worker whose
event loop still renews the lease for nothing, but a worker whose loop is blocked stops renewing
too — so keep the lease TTL longer than the timers it guards, or use no lease.

Expirations are wall-clock and converted to loop deadlines on receipt: hosts need synchronised
clocks (NTP); a skew of *s* seconds moves reaps by *s*.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

from .._checks import check_run_id
from ..errors import (
    CompactedError,
    StoreClosedError,
    StoreConnectionError,
    StoreTimeoutError,
    WriteOutcomeUnknownError,
)
from ..store import EventType, KeyValue, Store, WatchEvent
from ._client import TimerClient
from ._server import Reaper, TimerServer
from ._table import Armed
from ._wire import TimerRequest, check_duration, check_pid, check_signal, wall_clock

if TYPE_CHECKING:
    from ..events import EventSink

__all__ = [
    "DEFAULT_PREFIX",
    "StoreTimerClient",
    "StoreTimerServer",
    "run_prefix",
    "timer_key",
]

log = logging.getLogger("aioelastic.timer")

#: The key prefix timers live under unless told otherwise.
DEFAULT_PREFIX = "aioelastic/timers/"
#: Where the timers of one run live by convention: ``{RUN_PREFIX_ROOT}{run_id}/`` (see
#: :func:`run_prefix`; ``aioelastic status`` lists the timers there).
RUN_PREFIX_ROOT = "aioelastic/run-timers/"
#: Longest wait between two attempts to reach the store again.
MAX_RETRY_INTERVAL = 5.0


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not prefix:
        raise ValueError("prefix must not be empty (timers need a key space of their own)")
    return prefix


def _token(armed: Armed) -> tuple[str, int]:
    """The (key, mod_revision) a store timer was armed from."""
    token = armed.token
    assert isinstance(token, tuple)
    key, revision = token
    assert isinstance(key, str)
    assert isinstance(revision, int)
    return key, revision


def run_prefix(run_id: str) -> str:
    """The conventional timer prefix of a run, ``aioelastic/run-timers/<run_id>/``.

    Pass it as ``prefix=`` to the :class:`StoreTimerClient` and :class:`StoreTimerServer` of a
    job's workers so that ``aioelastic status --run-id <run_id>`` lists their active timers.
    """
    return f"{RUN_PREFIX_ROOT}{quote(check_run_id(run_id), safe='')}/"


def timer_key(prefix: str, worker_id: str, scope_id: str) -> str:
    """The store key of a worker's timer for a scope."""
    return f"{prefix}{quote(worker_id, safe='')}/{quote(scope_id, safe='')}"


class StoreTimerClient(TimerClient):
    """Acquires and releases ``worker_id``'s timers as keys in ``store`` under ``prefix``.

    ``lease`` attaches every timer key to a lease (see the module notes); ``pid`` tells a
    :class:`~aioelastic.timer.SignalReaper` on the same host which process to signal, and
    ``signal`` which signal.
    """

    def __init__(
        self,
        store: Store,
        worker_id: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        lease: int = 0,
        pid: int | None = None,
        signal: int | None = None,
    ) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self.store = store
        self.prefix = _check_prefix(prefix)
        self.lease = lease
        self.pid = check_pid(pid) if pid is not None else None
        self.signal = check_signal(signal) if signal is not None else None
        # validates worker_id (a non-empty str) the same way the server will
        TimerRequest(worker_id, "-", None)
        if not isinstance(worker_id, str):
            raise TypeError(f"worker_id must be a str, got {type(worker_id).__name__}")
        self.worker_id = worker_id

    def key(self, scope_id: str) -> str:
        return timer_key(self.prefix, self.worker_id, scope_id)

    async def _acquire(self, scope_id: str, after: float) -> None:
        request = TimerRequest(
            self.worker_id, scope_id, wall_clock() + after, pid=self.pid, signal=self.signal
        )
        await self.store.put(self.key(scope_id), request.to_json(), lease=self.lease)

    async def _release(self, scope_id: str) -> None:
        await self.store.delete(self.key(scope_id))


class StoreTimerServer(TimerServer):
    """Reaps the timers kept as keys under ``prefix`` in ``store`` (see the module notes).

    ``reaper`` gets each expired timer whose claim succeeded. Malformed values are logged and
    ignored (the server keeps running); a lost store connection is retried, then the state is
    re-read, so no timer is missed. ``wall`` is the clock wire expirations are read against.
    """

    def __init__(
        self,
        store: Store,
        reaper: Reaper,
        *,
        prefix: str = DEFAULT_PREFIX,
        history: int = 1000,
        wall: Callable[[], float] = wall_clock,
        retry_interval: float = 0.1,
        event_sink: EventSink | None = None,
    ) -> None:
        super().__init__(reaper, history=history, event_sink=event_sink)
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self.store = store
        self.prefix = _check_prefix(prefix)
        self._wall = wall
        self._retry_interval = check_duration(retry_interval, "retry_interval")
        if self._retry_interval <= 0:
            raise ValueError(f"retry_interval must be > 0 seconds, got {retry_interval!r}")
        self._keys: dict[str, tuple[str, str]] = {}  # key -> (worker, scope) armed from it

    def __repr__(self) -> str:
        return f"<StoreTimerServer {self.prefix!r} armed={self.armed}>"

    async def _run(self, ready: Callable[[], None]) -> None:
        started = False
        delay = self._retry_interval
        while True:
            try:
                snapshot = await self.store.range(self.prefix)
                self._reconcile(snapshot.kvs)
                async with self.store.watch(
                    self.prefix, start_revision=snapshot.revision + 1
                ) as events:
                    if not started:
                        started = True
                        ready()
                    delay = self._retry_interval
                    async for event in events:
                        self._on_event(event)
                log.warning("timer watch on %r ended; re-reading in %.2fs", self.prefix, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_INTERVAL)
            except CompactedError as exc:
                log.warning("timer watch fell behind (%s); re-reading %r", exc, self.prefix)
            except (StoreConnectionError, StoreTimeoutError) as exc:
                if not started:
                    raise
                log.warning(
                    "timer watch on %r lost (%s); retrying in %.2fs", self.prefix, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_INTERVAL)

    # -- applying the store's state

    def _parse(self, kv: KeyValue) -> TimerRequest | None:
        try:
            request = TimerRequest.from_json(kv.value)
            if not isinstance(request.worker_id, str):
                raise ValueError("worker must be a str")
            expected = timer_key(self.prefix, request.worker_id, request.scope_id)
            if kv.key != expected:
                raise ValueError(f"the key does not match its worker and scope ({expected!r})")
        except ValueError as exc:
            self._reject(f"at {kv.key!r}", exc)
            return None
        return request

    def _apply(self, kv: KeyValue) -> None:
        request = self._parse(kv)
        if request is None or request.expiration_time is None:
            self._forget(kv.key)
            return
        assert isinstance(request.worker_id, str)
        self._keys[kv.key] = (request.worker_id, request.scope_id)
        self._arm(
            request.worker_id,
            request.scope_id,
            self._deadline_from_wall(request.expiration_time, self._wall),
            expiration_time=request.expiration_time,
            pid=request.pid,
            signal=request.signal,
            token=(kv.key, kv.mod_revision),
        )

    def _forget(self, key: str) -> bool:
        ids = self._keys.pop(key, None)
        return ids is not None and self._disarm(*ids)

    def _reconcile(self, kvs: Sequence[KeyValue]) -> None:
        present = {kv.key: kv for kv in kvs}
        for key in list(self._keys):
            if key not in present:
                self._forget(key)
        for kv in kvs:
            ids = self._keys.get(kv.key)
            armed = self._timers.get(*ids) if ids is not None else None
            if armed is None or armed.token != (kv.key, kv.mod_revision):
                self._apply(kv)

    def _on_event(self, event: WatchEvent) -> None:
        if event.type is EventType.PUT:
            self._apply(event.kv)
        else:
            self._forget(event.kv.key)

    # -- claiming and reaping

    def _expire(self, armed: Armed) -> None:
        self._timers.remove(armed)
        key, _revision = _token(armed)
        if self._keys.get(key) == (armed.worker_id, armed.scope_id):
            del self._keys[key]
        self._spawn(self._claim_and_reap(armed), "claim")

    async def _claim_and_reap(self, armed: Armed) -> None:
        key, revision = _token(armed)
        delay = self._retry_interval
        while True:
            try:
                result = await self.store.compare_and_delete(key, revision)
            except WriteOutcomeUnknownError as exc:
                # Our delete may or may not have applied. If the key still holds this timer,
                # retry; if it is gone, we cannot tell our delete from a late release: the
                # deadline had passed, so reap.
                log.warning("claim of timer %r: outcome unknown (%s); reading back", key, exc)
                try:
                    current = await self.store.get(key)
                except (StoreConnectionError, StoreTimeoutError):
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_INTERVAL)
                    continue
                if current is not None and current.mod_revision == revision:
                    continue
                if current is None:
                    self._reap(armed)
                return
            except (StoreConnectionError, StoreTimeoutError) as exc:
                log.warning("cannot claim expired timer %r (%s); retrying", key, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_INTERVAL)
                continue
            except StoreClosedError:
                log.error("store closed before expired timer %r could be claimed", key)
                return
            if result.succeeded:
                self._reap(armed)
            return
