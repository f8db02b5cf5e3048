"""The dynamic (elastic) rendezvous: rounds of ``min..max`` nodes over any store backend.

How a round forms (keys as in :mod:`aioelastic.rendezvous._state`):

1. A joining node opens a watch on the run's small control prefix (``c/``), reads it, and
   registers for the round after the latest completed one by creating its own record
   ``n/<round>/<node>``, bound to its lease. One write per node per round; nobody rewrites a
   shared register.
2. The first node to register claims ``c/driver`` by compare-and-swap (bound to its lease). The
   driver alone watches the node records; it keeps a local count, so a round of N costs it O(N)
   events and nobody else anything. It completes the round at once when ``max_nodes`` have
   registered, or when ``last_call_timeout`` has passed since ``min_nodes`` had (a deadline on
   the event loop). A round cannot complete while members of the previous round are still in it
   (they leave it by registering for the next one, or by dying). Once they have, a round whose
   registrations are all survivors of the last one completes at once (``fast_reform``): after a
   loss or a restart nobody waits out a last call for nodes that are not coming.
3. The driver finalises the round by compare-and-swap of ``c/round`` (members in rank order,
   rank 0's master address). Every waiting node wakes on that one write: completion costs each
   node one watch event. If the driver dies, its lease takes ``c/driver`` with it and a waiting
   node claims it.
4. A member's record stays while it is a member: if it dies, the lease expiry deletes it and the
   other members get a ``PARTICIPANT_LOST`` event (torch misses this, #111646). A node that
   registers for the next round is ``NODES_WAITING`` for them. ``wait_for_change`` counts the
   registrations once and keeps the counts from its watch's events (no reads per event).
5. The watch of ``c/`` and the view it keeps outlive a completed join: the next join of the
   handler starts from them (no watch to open, nothing to read before registering).

Ranks are deterministic: members of the previous round keep their rank when it still fits; the
others fill the free ranks in order of registration. Nodes beyond ``max_nodes`` stay registered
as standbys for the next round (no join timeout applies to them) and exit with
:class:`~aioelastic.errors.RendezvousGracefulExitError` when the run closes.

Closing (``set_closed``) is sticky for the run id, as in torch, but only an explicit close closes:
leaving (``aclose``, a crash, a signal) never does, so a restarted agent can rejoin a run a peer
left (the trigger of torch #147064). A handler created with ``reopen_closed=True`` that meets a
closed run on its first join starts a new generation of rounds (for a job restarted deliberately
under the same run id): it drops the closed generation's records and marks the close record
reopened; the nodes of the closed generation still see the run as closed.

Every wait is a watch or a ``loop.time()`` deadline; nothing sleeps and re-reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import secrets
import socket
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import anyio

from .. import events as _events
from ..errors import (
    CompactedError,
    LeaseExpiredError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousTimeoutError,
    StoreError,
    WriteOutcomeUnknownError,
)
from ..store import EventType, KeyValue, LeaseKeeper, RangeResult, Watch, WatchEvent
from ._state import (
    ClosedRecord,
    DriverRecord,
    NodeRecord,
    RoundRecord,
    RunKeys,
    check_node_id,
)
from .api import (
    RendezvousEvent,
    RendezvousEventKind,
    RendezvousResult,
    RendezvousStatistics,
    RendezvousStatus,
    RendezvousStoreInfo,
    _BuiltinHandler,
)

if TYPE_CHECKING:
    from ..events import EventSink
    from ..store import Store

__all__ = ["DEFAULTS", "DynamicRendezvousHandler", "assign_ranks"]

#: the event kind (aioelastic.events) of each membership change
_CHANGE_KINDS = {
    RendezvousEventKind.NODES_WAITING: "rendezvous.nodes_waiting",
    RendezvousEventKind.PARTICIPANT_LOST: "rendezvous.member_lost",
    RendezvousEventKind.ROUND_SUPERSEDED: "rendezvous.round_superseded",
    RendezvousEventKind.CLOSED: "rendezvous.closed",
    RendezvousEventKind.ERROR: "rendezvous.error",
}

log = logging.getLogger("aioelastic.rendezvous")

#: torch's defaults, in seconds (lease TTL = keep_alive_interval x keep_alive_max_attempt).
DEFAULTS = {
    "join_timeout": 600.0,
    "last_call_timeout": 30.0,
    "close_timeout": 30.0,
    "keep_alive_interval": 5.0,
    "keep_alive_max_attempt": 3,
}


@functools.cache
def _default_addr() -> str:
    return socket.getfqdn()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


#: the context of the wake-ups below: they only resolve a future, so need no copy of the caller's
_WAKE_CONTEXT = contextvars.Context()


async def _first_done(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Wait until one of ``futures`` is done: ``asyncio.wait(FIRST_COMPLETED)`` without its
    sets, coroutines and context copies, since every joining node waits on this at once."""
    futures = tuple(futures)
    if any(f.done() for f in futures):
        return
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: object) -> None:
        _resolve(waiter)

    for future in futures:
        future.add_done_callback(wake, context=_WAKE_CONTEXT)
    try:
        await waiter
    finally:
        for future in futures:
            future.remove_done_callback(wake)


def _free_port() -> int:
    """A TCP port free right now, for rank 0's collective (torch picks it the same way)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


def assign_ranks(
    candidates: Iterable[tuple[str, int]], previous: tuple[str, ...], max_nodes: int
) -> tuple[str, ...]:
    """The members of a round in rank order, from ``(node_id, registration revision)`` pairs.

    Members of the ``previous`` round come first (they are chosen before newcomers when there are
    more than ``max_nodes`` candidates) and keep their previous rank when it is below the new world
    size; the other chosen nodes fill the free ranks in order of registration, then node id.
    """
    prev_rank = {node: rank for rank, node in enumerate(previous)}

    def priority(item: tuple[str, int]) -> tuple[int, int, str]:
        node, revision = item
        rank = prev_rank.get(node)
        return (0, rank, "") if rank is not None else (1, revision, node)

    chosen = sorted(candidates, key=priority)[:max_nodes]
    size = len(chosen)
    slots: list[str | None] = [None] * size
    rest: list[str] = []
    for node, _ in chosen:
        rank = prev_rank.get(node)
        if rank is not None and rank < size:
            slots[rank] = node
        else:
            rest.append(node)
    fill = iter(rest)
    return tuple(slot if slot is not None else next(fill) for slot in slots)


class _Control:
    """A node's view of ``c/`` (round, driver and closed records, decoded) and the watch that
    keeps it current: loaded from a range, then updated by the watch's events. ``seen`` is the
    revision the view is current as of. It outlives a completed join (see ``_join``)."""

    def __init__(self, keys: RunKeys, watch: Watch) -> None:
        self.keys = keys
        self.watch = watch
        self.round_kv: KeyValue | None = None
        self.round: RoundRecord | None = None
        self.driver_kv: KeyValue | None = None
        self.driver: DriverRecord | None = None
        self.closed: ClosedRecord | None = None
        self.closed_kv: KeyValue | None = None
        self.seen = 0
        self.usable = True  # False once the watch failed: the view is not kept then

    @classmethod
    async def open(cls, store: Store, keys: RunKeys) -> _Control:
        """Read ``c/`` and watch it from there (one request on the http store)."""
        snapshot, watch = await store.range_and_watch(keys.ctl)
        ctl = cls(keys, watch)
        try:
            ctl.load(snapshot)  # RendezvousStateError on a corrupt record
        except BaseException:
            await ctl.aclose()
            raise
        return ctl

    async def resync(self, store: Store) -> None:
        """The watch fell behind a compaction (events unread while this node was a member, on
        the memory store): a new watch, ``c/`` read afresh."""
        log.debug("%s: the control watch fell behind a compaction; reading afresh", self.keys.ctl)
        await self.aclose()
        fresh = await _Control.open(store, self.keys)
        self.__dict__.update(fresh.__dict__)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
            await self.watch.aclose()

    def load(self, snapshot: RangeResult) -> None:
        for kv in snapshot:
            self.apply(EventType.PUT, kv)
        self.seen = snapshot.revision

    def apply_event(self, event: WatchEvent) -> None:
        """Apply a watch event of ``c/`` that is newer than this view (older ones are in it)."""
        if event.revision > self.seen:
            self.apply(event.type, event.kv)
            self.seen = event.revision

    def apply(self, type_: EventType, kv: KeyValue) -> None:
        keys = self.keys
        put = type_ is EventType.PUT
        if kv.key == keys.round:
            self.round_kv = kv if put else None
            self.round = RoundRecord.decode(kv.key, kv.value) if put else None
        elif kv.key == keys.driver:
            self.driver_kv = kv if put else None
            self.driver = DriverRecord.decode(kv.key, kv.value) if put else None
        elif kv.key == keys.closed:
            self.closed_kv = kv if put else None
            self.closed = ClosedRecord.decode(kv.key, kv.value) if put else None


class _Counts:
    """How many nodes are registered for a member's round (``live``) and for the next
    (``waiting``): counted once, then kept by the member watch's events after each count."""

    def __init__(self, keys: RunKeys, round_: int, live: RangeResult, waiting: RangeResult) -> None:
        self.keys = keys
        self.round = round_
        self.live = live.count
        self.waiting = waiting.count
        self._counted_at = (live.revision, waiting.revision)

    def apply(self, event: WatchEvent) -> None:
        parsed = self.keys.parse_node_key(event.kv.key)
        if parsed is None:
            return
        index = parsed[0] - self.round
        if index not in (0, 1) or event.revision <= self._counted_at[index]:
            return  # another round, or already in the count
        kv = event.kv
        if event.type is EventType.DELETE:
            delta = -1
        elif kv.create_revision == kv.mod_revision:  # created (an update changes no count)
            delta = 1
        else:
            return
        if index == 0:
            self.live += delta
        else:
            self.waiting += delta


class DynamicRendezvousHandler(_BuiltinHandler):
    """The elastic rendezvous over any :class:`~aioelastic.store.Store` (see the module doc).

    ``lease_ttl`` is how long a dead node's records outlive it (default: torch's
    ``keep_alive_interval x keep_alive_max_attempt`` = 15 s); the lease is renewed every
    ``keep_alive_interval`` (default TTL / 3). ``node_id`` names this node in the store (default:
    random); reusing one across restarts of an agent keeps its rank. ``owns_store``: close the
    store with the handler. ``event_sink``: where this handler's structured events go (round
    completions, membership changes, status transitions; see :mod:`aioelastic.events`; default:
    ``AIOELASTIC_EVENTS``, else none); the attribute :attr:`event_sink` may be replaced later.
    ``fast_reform`` (default on): a round after a completed one forms at once, without its last
    call, when every surviving member of the last round has registered again and no other node
    is waiting (torchft's "fast quorum"); off, the last call is always waited out, as torch does.
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        *,
        join_timeout: float = DEFAULTS["join_timeout"],
        last_call_timeout: float = DEFAULTS["last_call_timeout"],
        close_timeout: float = DEFAULTS["close_timeout"],
        lease_ttl: float = 15.0,
        keep_alive_interval: float | None = None,
        node_id: str | None = None,
        local_addr: str | None = None,
        reopen_closed: bool = False,
        fast_reform: bool = True,
        backend: str = "memory",
        owns_store: bool = False,
        event_sink: EventSink | None = None,
    ) -> None:
        for name, value in (("min_nodes", min_nodes), ("max_nodes", max_nodes)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
        if max_nodes < min_nodes:
            raise ValueError(f"max_nodes ({max_nodes}) must be >= min_nodes ({min_nodes})")
        for name, seconds, zero_ok in (
            ("join_timeout", join_timeout, False),
            ("last_call_timeout", last_call_timeout, True),
            ("close_timeout", close_timeout, False),
            ("lease_ttl", lease_ttl, False),
        ):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise TypeError(f"{name} must be a number of seconds, got {seconds!r}")
            if not (seconds >= 0 if zero_ok else seconds > 0) or seconds == float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {seconds}")
        self._store = store
        self._keys = RunKeys(run_id)
        self._min = min_nodes
        self._max = max_nodes
        self._join_timeout = float(join_timeout)
        self._last_call = float(last_call_timeout)
        self._close_timeout = float(close_timeout)
        self._lease_ttl = float(lease_ttl)
        self._keep_alive_interval = keep_alive_interval
        self._node_id = check_node_id(node_id) if node_id is not None else secrets.token_hex(6)
        self._local_addr = local_addr
        self._reopen_closed = reopen_closed
        self._fast_reform = bool(fast_reform)
        self._backend = backend
        self._owns_store = owns_store

        self._keeper: LeaseKeeper | None = None
        self._lock = asyncio.Lock()
        self._round = -1  # the last round returned to this node
        self._result: RendezvousResult | None = None
        self._round_record: RoundRecord | None = None  # the round of self._result
        self._record_round: int | None = None  # the round our node record is registered for
        self._standby = False
        self._closed_seen = False
        self._handler_closed = False
        self._closing: asyncio.Future[None] | None = None  # set by aclose: ends a pending join
        self._error: BaseException | None = None
        # the watch of c/ and its view, kept from a completed join for the next one
        self._kept: _Control | None = None
        # change notification for members of self._round
        self._member_watch: Watch | None = None
        self._member_counts: _Counts | None = None
        self._member_revision = 0
        # statistics (event-loop time)
        self._joins = 0
        self._rounds_driven = 0
        self._join_started: float | None = None
        self._completed_at: float | None = None
        self._last_call_deadline: float | None = None
        self._rejoined: set[str] = set()
        self._lost: set[str] = set()
        self._finalizing = False  # our driver task is writing (or cleaning up after) a round
        #: where structured events go (see :mod:`aioelastic.events`)
        self.event_sink: EventSink = _events.resolve_sink(event_sink)
        self._reported_status = RendezvousStatus.ACTIVE

    def __repr__(self) -> str:
        return (
            f"<DynamicRendezvousHandler run_id={self.run_id!r} node={self._node_id} "
            f"round={self._round} status={self.status.value}>"
        )

    # -- identity and status

    def get_backend(self) -> str:
        return self._backend

    @property
    def run_id(self) -> str:
        return self._keys.run_id

    @property
    def node_id(self) -> str:
        """This node's id in the store (``RendezvousResult.participants`` lists these)."""
        return self._node_id

    @property
    def store(self) -> Store:
        """The store this handler coordinates through."""
        return self._store

    @property
    def min_nodes(self) -> int:
        return self._min

    @property
    def max_nodes(self) -> int:
        return self._max

    @property
    def round(self) -> int:
        """The last round returned to this node (-1 before the first)."""
        return self._round

    @property
    def lease(self) -> LeaseKeeper | None:
        """The lease that keeps this node's records alive (None before the first join)."""
        return self._keeper

    def statistics(self) -> RendezvousStatistics:
        """A snapshot of this handler (times in event-loop time)."""
        keeper = self._keeper
        return RendezvousStatistics(
            node_id=self._node_id,
            status=self.status,
            round=self._round,
            world_size=0 if self._result is None else self._result.world_size,
            joins=self._joins,
            rounds_driven=self._rounds_driven,
            join_started=self._join_started,
            completed_at=self._completed_at,
            last_call_deadline=self._last_call_deadline,
            lease_id=0 if keeper is None or keeper.lost else keeper.id,
        )

    # -- plumbing

    @contextlib.contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        """Store errors become RendezvousConnectionError; errors put the handler in ERROR."""
        try:
            yield
        except (RendezvousClosedError, RendezvousGracefulExitError, RendezvousTimeoutError):
            raise
        except RendezvousError as exc:
            self._error = exc
            raise
        except (StoreError, LeaseExpiredError) as exc:
            error = RendezvousConnectionError(f"{what} failed for run {self.run_id!r}: {exc}")
            self._error = error
            raise error from exc

    async def _ensure_lease(self) -> LeaseKeeper:
        keeper = self._keeper
        if keeper is not None and not keeper.lost:
            return keeper
        if keeper is not None:  # lost: our records went with it
            self._record_round = None
            await keeper.aclose(revoke=False)
        keeper = self._store.lease(self._lease_ttl, keep_alive_interval=self._keep_alive_interval)
        await keeper.start()
        keeper.on_lost(self._on_lease_lost)
        self._keeper = keeper
        return keeper

    def _on_lease_lost(self, error: LeaseExpiredError) -> None:
        if not self._handler_closed:
            self._error = error
            self._emit("rendezvous.lease_lost", round=self._round, error=str(error))
            self._note_status()

    # -- structured events (aioelastic.events): never raise, cost ~nothing with no sink

    def _sink_active(self) -> bool:
        return not isinstance(self.event_sink, _events.NullSink)

    def _emit(self, kind: str, **fields: Any) -> None:
        _events.emit(self.event_sink, kind, run_id=self.run_id, node=self._node_id, **fields)

    def _note_status(self) -> None:
        """Emit ``rendezvous.status`` if the status changed since the last call."""
        status = self.status
        if status is not self._reported_status:
            previous, self._reported_status = self._reported_status, status
            error = self._error
            self._emit(
                "rendezvous.status",
                status=status.value,
                previous=previous.value,
                round=self._round,
                error=None if error is None else f"{type(error).__name__}: {error}",
            )

    # -- next_rendezvous

    async def next_rendezvous(self) -> RendezvousResult:
        """Wait until a round completes with this node in it; return this node's view of it.

        Raises :class:`~aioelastic.errors.RendezvousClosedError` if the run is (or gets) closed,
        :class:`~aioelastic.errors.RendezvousGracefulExitError` for a standby when it closes,
        :class:`~aioelastic.errors.RendezvousTimeoutError` after ``join_timeout`` (standbys
        excepted), :class:`~aioelastic.errors.RendezvousConnectionError` if the store fails.
        Cancelling it withdraws this node's registration.
        """
        self._check_usable()
        async with self._lock:
            self._check_usable()
            await self._close_member_watch()
            self._emit("rendezvous.join_started", previous_round=self._round)
            try:
                with self._translate("next_rendezvous"):
                    result = await self._join()
            except BaseException as exc:
                self._emit(
                    "rendezvous.join_failed",
                    previous_round=self._round,
                    error_type=type(exc).__name__,
                    error=str(exc),
                )
                self._note_status()
                raise
            self._error = None
            self._note_status()
            return result

    async def _join(self) -> RendezvousResult:
        """Take part in rounds under this node's lease until one completes with it.

        The watch of ``c/`` and the view it keeps (:class:`_Control`) outlive a completed join:
        the next join of this handler goes on from them, without opening a watch or reading
        ``c/`` again. A first join opens the watch and reads ``c/`` while the lease is granted
        (one round trip less).
        """
        loop = asyncio.get_running_loop()
        self._joins += 1
        self._join_started = loop.time()
        deadline = loop.time() + self._join_timeout
        keeper = self._keeper
        granting = None
        if keeper is None or keeper.lost:
            granting = loop.create_task(self._ensure_lease(), name="aioelastic-rdzv-lease")
        ctl, self._kept = self._kept, None
        completed = False
        try:
            if ctl is None:
                ctl = await _Control.open(self._store, self._keys)
            if granting is not None:
                keeper = await granting
                granting = None  # done and its result taken: let it go for the join's length
            assert keeper is not None
            with keeper.guard():  # our records vanish with the lease: stop waiting then
                result = await self._take_part(keeper, ctl, deadline)
            completed = True
            return result
        finally:
            if granting is not None and not granting.done():
                granting.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.wait([granting])
            if granting is not None and not granting.cancelled():
                granting.exception()  # retrieved: a failure was raised above, or is moot
            if ctl is not None:
                if completed and ctl.usable and not self._handler_closed:
                    self._kept = ctl
                else:
                    await ctl.aclose()

    async def _take_part(
        self, keeper: LeaseKeeper, ctl: _Control, deadline: float
    ) -> RendezvousResult:
        loop = asyncio.get_running_loop()
        if self._closing is None:
            self._closing = loop.create_future()
        closing = self._closing
        if self._handler_closed and not closing.done():
            closing.set_result(None)  # aclose() came before the future existed (lease grant)
        driver: asyncio.Task[None] | None = None
        driven: int | None = None  # the round our driver task ran for
        completed = False
        # read control events from now on, also while we register (see the drain below)
        next_event: asyncio.Task[WatchEvent] | None = loop.create_task(ctl.watch.__anext__())
        # one timer for the join deadline (not one per wait)
        timed_out: asyncio.Future[None] = loop.create_future()
        timer = loop.call_at(deadline, _resolve, timed_out, context=_WAKE_CONTEXT)
        try:
            while True:
                if next_event is not None and next_event.done():
                    event_task, next_event = next_event, None
                    try:
                        ctl.apply_event(event_task.result())
                    except CompactedError:
                        await ctl.resync(self._store)
                        next_event = loop.create_task(ctl.watch.__anext__())
                blocked = ctl.closed is not None and self._closed_by(ctl.closed)
                if blocked and ctl.closed_kv is not None:
                    if self._reopen_closed and self._is_new() and not self._closed_seen:
                        await self._reopen(ctl.closed_kv)  # its write arrives as an event
                    else:
                        self._closed_seen = True
                        if self._standby:
                            raise RendezvousGracefulExitError(
                                f"the rendezvous {self.run_id!r} closed while this node "
                                "was a standby"
                            )
                        raise RendezvousClosedError(f"the rendezvous {self.run_id!r} is closed")
                latest = ctl.round
                if (
                    latest is not None
                    and ctl.round_kv is not None
                    and latest.round > self._round
                    and latest.round == self._record_round
                    and latest.rank_of(self._node_id) is not None
                ):
                    completed = True
                    return self._completed(latest, ctl.round_kv.mod_revision)
                target = 0 if latest is None else latest.round + 1
                if not blocked and self._record_round != target:
                    self._standby = await self._is_standby(latest)
                    await self._register(target, keeper)
                if driver is not None and driver.done():
                    driver.result()  # a driver that failed fails the join
                    driver = None
                if next_event is not None and next_event.done():
                    # An event arrived while we registered: apply it (above) before deciding
                    # to claim the driver, so that nodes joining together do not all send a
                    # claim doomed to fail once the first one has landed.
                    continue
                if (
                    not blocked
                    and driver is None
                    and driven != target
                    and await self._claim_driver(ctl, target, keeper)
                ):
                    driven = target
                    driver = loop.create_task(
                        self._drive(target, ctl.round_kv),
                        name=f"aioelastic-rdzv-driver-{target}",
                    )
                # wait for a control event, the driver's end, or the join deadline
                if next_event is None:
                    next_event = loop.create_task(ctl.watch.__anext__())
                waiters: list[asyncio.Future[Any]] = [next_event, closing]
                if driver is not None:
                    waiters.append(driver)
                timing = not self._standby  # a standby waits without a join timeout
                if timing:
                    waiters.append(timed_out)
                await _first_done(waiters)
                if closing.done():
                    raise RendezvousClosedError(
                        f"the rendezvous handler for {self.run_id!r} was closed while joining"
                    )
                if timing and timed_out.done():
                    raise RendezvousTimeoutError(
                        f"the rendezvous {self.run_id!r} did not complete within "
                        f"join_timeout={self._join_timeout}s"
                    )
        finally:
            timer.cancel()
            if completed and driver is not None and not driver.done() and self._finalizing:
                # Our driver wrote the round record we read, and the store's answer to that
                # write can arrive after the watch event (etcd, http): let it finish (count the
                # round, drop the previous round's data) instead of cancelling it mid-write. (A
                # driver still counting lost the round to an earlier driver: cancel it.)
                with anyio.move_on_after(self._close_timeout, shield=True):
                    await asyncio.wait([driver])
            for task in (next_event, driver):
                if task is not None and not task.done():
                    task.cancel()
            tasks = [t for t in (next_event, driver) if t is not None]
            if tasks:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(tasks)
                for task in tasks:  # retrieve, so asyncio does not log them
                    if not task.cancelled():
                        task.exception()
            if next_event is not None and not next_event.cancelled():
                # an event read but not applied: the view must not miss it (the watch is kept)
                if next_event.exception() is None:
                    ctl.apply_event(next_event.result())
                else:
                    ctl.usable = False
            if not completed:
                await self._withdraw(keeper)

    def _is_new(self) -> bool:
        """Whether this handler has not taken part in the run yet (no round, no registration)."""
        return self._round < 0 and self._record_round is None

    def _closed_by(self, record: ClosedRecord) -> bool:
        """Whether a close record closes the run for this handler.

        A plain close closes it for everyone. After a reopen, it still closes it for the nodes of
        the closed generation (those that took part in a round up to ``record.round``).
        """
        if not record.reopened:
            return True
        if self._is_new():
            return False
        mine = self._round if self._record_round is None else max(self._round, self._record_round)
        return mine <= record.round

    async def _is_standby(self, latest: RoundRecord | None) -> bool:
        """Whether this node arrives as a standby: the latest round is full and all alive."""
        if (
            latest is None
            or len(latest.members) < self._max
            or latest.rank_of(self._node_id) is not None
        ):
            return False
        live = await self._store.range(self._keys.nodes_of(latest.round), limit=1)
        return live.count >= self._max

    async def _reopen(self, closed: KeyValue) -> None:
        """Clear a close (``reopen_closed``): drop the closed generation's records, then the
        close record itself, both only if written before the close we saw."""
        store, keys = self._store, self._keys
        for kv in await store.range(keys.nodes):
            if kv.mod_revision < closed.mod_revision:
                await store.compare_and_delete(kv.key, kv.mod_revision)
        driver = await store.get(keys.driver)
        if driver is not None and driver.mod_revision < closed.mod_revision:
            await store.compare_and_delete(keys.driver, driver.mod_revision)
        record = ClosedRecord.decode(closed.key, closed.value)
        reopened = ClosedRecord(record.round, reopened=True).encode()
        result = await store.compare_and_swap(keys.closed, closed.mod_revision, reopened)
        if result.succeeded:
            log.info("run %r was closed; reopened by %s", self.run_id, self._node_id)

    async def _register(self, target: int, keeper: LeaseKeeper) -> None:
        store, keys = self._store, self._keys
        addr = self._local_addr or _default_addr()
        record = NodeRecord(self._node_id, addr, _free_port()).encode()
        key = keys.node(target, self._node_id)
        try:
            result = await store.compare_and_swap(key, 0, record, lease=keeper.id)
        except WriteOutcomeUnknownError:
            self._record_round = target  # it may have applied: a withdrawal deletes it
            raise
        if not result.succeeded and (result.kv is None or result.kv.lease != keeper.id):
            raise RendezvousError(
                f"node id {self._node_id!r} is already registered for round {target} of "
                f"{self.run_id!r} by another live handler"
            )
        old, self._record_round = self._record_round, target
        if old is not None and old != target:
            await store.delete(keys.node(old, self._node_id))

    async def _claim_driver(self, ctl: _Control, target: int, keeper: LeaseKeeper) -> bool:
        current = ctl.driver
        if current is not None and current.round >= target:
            # ours from an interrupted join with this lease: drive again
            return (
                current.round == target
                and current.node_id == self._node_id
                and ctl.driver_kv is not None
                and ctl.driver_kv.lease == keeper.id
            )
        expected = 0 if ctl.driver_kv is None else ctl.driver_kv.mod_revision
        record = DriverRecord(target, self._node_id).encode()
        result = await self._store.compare_and_swap(
            self._keys.driver, expected, record, lease=keeper.id
        )
        return result.succeeded

    async def _withdraw(self, keeper: LeaseKeeper) -> None:
        """Undo a join that did not complete: drop our registration and driver claim."""
        if keeper.lost or self._store.closed:
            self._record_round = None
            return
        store, keys = self._store, self._keys
        with anyio.move_on_after(self._close_timeout, shield=True):
            try:
                # our registration, and our record as a member of the round we were leaving
                for round_ in {self._record_round, self._round} - {None, -1}:
                    assert round_ is not None
                    await store.delete(keys.node(round_, self._node_id))
                self._record_round = None
                kv = await store.get(keys.driver)
                if kv is not None and kv.lease == keeper.id:
                    await store.compare_and_delete(keys.driver, kv.mod_revision)
            except (StoreError, RendezvousError) as exc:
                log.warning("could not withdraw %s from %r: %s", self._node_id, self.run_id, exc)

    def _completed(self, record: RoundRecord, revision: int) -> RendezvousResult:
        rank = record.rank_of(self._node_id)
        assert rank is not None
        self._round = record.round
        self._round_record = record
        self._standby = False
        self._member_revision = revision
        self._rejoined = set()
        self._lost = set()
        result = RendezvousResult(
            run_id=self.run_id,
            round=record.round,
            rank=rank,
            world_size=len(record.members),
            participants=record.members,
            node_id=self._node_id,
            store=self._store.namespace(self._keys.data(record.round)),
            bootstrap_store_info=RendezvousStoreInfo(record.master_addr, record.master_port),
        )
        self._result = result
        self._completed_at = now = asyncio.get_running_loop().time()
        self._emit(
            "rendezvous.round_completed",
            round=record.round,
            rank=rank,
            world_size=len(record.members),
            # N members each listing N participants is O(N^2): only for a sink that takes them
            participants=list(record.members) if self._sink_active() else [],
            master_addr=record.master_addr,
            master_port=record.master_port,
            duration=None if self._join_started is None else round(now - self._join_started, 6),
        )
        return result

    # -- the driver of a forming round

    async def _drive(self, target: int, prev_kv: KeyValue | None) -> None:
        """Count registrations for ``target``; complete it at max, or at the last-call deadline.

        ``prev_kv`` is the round record as the joiner last saw it (the finalising
        compare-and-swap fails harmlessly if it has changed since).
        """
        loop = asyncio.get_running_loop()
        store, keys = self._store, self._keys
        prev = None if prev_kv is None else RoundRecord.decode(prev_kv.key, prev_kv.value)
        if (-1 if prev is None else prev.round) != target - 1:
            return  # a newer round completed meanwhile: the joiner sees it on its watch
        current: dict[str, KeyValue] = {}  # registered for target
        previous: set[str] = set()  # still registered for target - 1 (the round must drain)
        newcomers: set[str] = set()  # registered for target, not members of target - 1

        def apply(type_: EventType, kv: KeyValue) -> None:
            parsed = keys.parse_node_key(kv.key)
            if parsed is None:
                return
            round_, node = parsed
            if round_ == target:
                if type_ is EventType.PUT:
                    NodeRecord.decode(kv.key, kv.value)  # validate on read
                    current[node] = kv
                    if prev is None or prev.rank_of(node) is None:
                        newcomers.add(node)
                else:
                    current.pop(node, None)
                    newcomers.discard(node)
            elif round_ == target - 1:
                if type_ is EventType.PUT:
                    previous.add(node)
                else:
                    previous.discard(node)

        snapshot, events = await store.range_and_watch(keys.nodes)
        async with events:
            for kv in snapshot:
                apply(EventType.PUT, kv)
            seen = snapshot.revision
            last_call_at: float | None = None
            while True:
                # Once the last round has drained (each member registered again or died), a
                # round of its survivors only (no newcomer) forms at once when fast_reform is on:
                # the last call would wait for nodes that are not coming (torchft's fast quorum).
                if not previous and len(current) >= self._min:
                    now = loop.time()
                    if last_call_at is None:
                        last_call_at = now + self._last_call
                        self._last_call_deadline = last_call_at
                    if (
                        len(current) >= self._max
                        or now >= last_call_at
                        or (self._fast_reform and prev is not None and not newcomers)
                    ):
                        await self._finalize(target, prev_kv, prev, current)
                        return
                else:
                    last_call_at = None  # below min again: the window restarts (as torch's)
                event: WatchEvent | None = None
                if last_call_at is None:
                    event = await events.__anext__()
                else:
                    with anyio.move_on_after(max(0.0, last_call_at - loop.time())):
                        event = await events.__anext__()
                if event is not None and event.revision > seen:
                    apply(event.type, event.kv)

    async def _finalize(
        self,
        target: int,
        prev_kv: KeyValue | None,
        prev: RoundRecord | None,
        current: dict[str, KeyValue],
    ) -> bool:
        store, keys = self._store, self._keys
        members = assign_ranks(
            ((node, kv.create_revision) for node, kv in current.items()),
            prev.members if prev is not None else (),
            self._max,
        )
        rank0 = current[members[0]]
        master = NodeRecord.decode(rank0.key, rank0.value)
        record = RoundRecord(target, members, master.addr, master.port)
        expected = 0 if prev_kv is None else prev_kv.mod_revision
        self._finalizing = True  # from here the joiner lets this task finish (see _take_part)
        try:
            with anyio.CancelScope(shield=True):  # the joiner may see the write before we return
                result = await store.compare_and_swap(keys.round, expected, record.encode())
                if result.succeeded:
                    self._rounds_driven += 1
            if result.succeeded:
                log.info("run %r round %d complete: %d members", self.run_id, target, len(members))
                self._emit("rendezvous.round_finalized", round=target, world_size=len(members))
                if target > 0:  # the previous round has drained: its data store is garbage
                    await store.delete_prefix(keys.data(target - 1))
        finally:
            self._finalizing = False
        return result.succeeded

    # -- queries and closing

    async def _latest_round(self) -> RoundRecord | None:
        kv = await self._store.get(self._keys.round)
        return None if kv is None else RoundRecord.decode(kv.key, kv.value)

    async def num_nodes_waiting(self) -> int:
        """How many nodes a re-rendezvous would change: > 0 means "restart to take them".

        Counts nodes registered for the next round (late nodes, and members that re-registered
        to restart) and members of the latest round that are gone (their lease expired, or they
        left) — so an agent that polls this, as torch's does, restarts when a participant dies
        (torch #111646). Standbys of a full round are not counted while every member is alive (a
        restart could not take them); once a member is gone they are.
        """
        self._check_usable()
        with self._translate("num_nodes_waiting"):
            return await self._count_waiting(await self._latest_round())

    async def _count_waiting(self, latest: RoundRecord | None) -> int:
        if latest is None:
            return (await self._store.range(self._keys.nodes_of(0), limit=1)).count
        return await self._waiting_after(latest.round, len(latest.members))

    async def _waiting_after(self, round_: int, world_size: int) -> int:
        """``num_nodes_waiting`` for a round of ``world_size``: two counts, no decoding."""
        live, waiting = await self._registrations(round_)
        return self._waiting(live.count, waiting.count, world_size)

    async def _registrations(self, round_: int) -> tuple[RangeResult, RangeResult]:
        """Counts (no key-values) of the nodes registered for ``round_`` and for the next."""
        store, keys = self._store, self._keys
        # one after the other: on one pooled connection, not two
        live = await store.range(keys.nodes_of(round_), limit=1)
        waiting = await store.range(keys.nodes_of(round_ + 1), limit=1)
        return live, waiting

    def _waiting(self, live: int, waiting: int, world_size: int) -> int:
        """``num_nodes_waiting`` from ``live`` registrations for a round of ``world_size`` and
        ``waiting`` ones for the next."""
        if live < world_size:  # members gone or restarting: a new round is due
            return max(waiting, world_size - live)
        if world_size >= self._max:  # full and all alive: a restart could not take anyone
            return 0
        return waiting

    async def is_closed(self) -> bool:
        """Whether the run is closed (this handler's own close state is sticky)."""
        if self._closed_seen:
            return True
        if self._handler_closed:
            raise RendezvousClosedError(f"the rendezvous handler for {self.run_id!r} is closed")
        with self._translate("is_closed"):
            kv = await self._store.get(self._keys.closed)
        if kv is None or not self._closed_by(ClosedRecord.decode(kv.key, kv.value)):
            return False
        if not (self._reopen_closed and self._is_new()):
            self._closed_seen = True
        return True

    async def set_closed(self) -> None:
        """Close the run: every waiting node's ``next_rendezvous`` raises, members get CLOSED."""
        if self._closed_seen:
            return
        if self._handler_closed:
            raise RendezvousClosedError(f"the rendezvous handler for {self.run_id!r} is closed")
        with self._translate("set_closed"):
            try:
                with anyio.fail_after(self._close_timeout):
                    latest = await self._latest_round()
                    record = ClosedRecord(-1 if latest is None else latest.round)
                    await self._store.put(self._keys.closed, record.encode())
            except TimeoutError:
                raise RendezvousTimeoutError(
                    f"closing {self.run_id!r} took longer than close_timeout={self._close_timeout}s"
                ) from None
        self._closed_seen = True
        self._emit("rendezvous.closed", round=record.round, by_this_node=True)
        self._note_status()

    async def shutdown(self) -> bool:
        """torch's ``shutdown``: close the run, then leave. Returns False if closing failed.

        torch's agent calls this on every exit, which closes the run for everyone when one agent
        is interrupted (#147064); call :meth:`aclose` instead to leave without closing.
        """
        ok = True
        try:
            if not self._handler_closed:
                await self.set_closed()
        except RendezvousError as exc:
            log.warning("shutdown of %r could not close the run: %s", self.run_id, exc)
            ok = False
        await self.aclose()
        return ok

    async def aclose(self) -> None:
        """Leave: stop heart-beating and revoke the lease (this node's records vanish now).

        A pending ``next_rendezvous`` withdraws and raises ``RendezvousClosedError``.
        """
        if self._handler_closed:
            return
        self._handler_closed = True
        if self._closing is not None and not self._closing.done():
            self._closing.set_result(None)
        async with self._lock:  # a pending join withdraws and returns first
            await self._close_member_watch()
            kept, self._kept = self._kept, None
            if kept is not None:
                await kept.aclose()
            if self._keeper is not None:
                await self._keeper.aclose()
            self._record_round = None
        self._note_status()
        if self._owns_store:
            await self._store.aclose()

    # -- change notification

    async def _close_member_watch(self) -> None:
        watch, self._member_watch = self._member_watch, None
        self._member_counts = None
        if watch is not None:
            with contextlib.suppress(StoreError):
                await watch.aclose()

    async def wait_for_change(self) -> RendezvousEvent:
        """Wait for the next change to the round last returned to this node.

        ``NODES_WAITING`` (a node registered for the next round and it could take it),
        ``PARTICIPANT_LOST`` (a member's lease expired, or it left without re-registering),
        ``ROUND_SUPERSEDED``, ``CLOSED``, or ``ERROR`` (this node's lease was lost). Events are
        delivered once each, in store order; nothing polls.
        """
        if self._handler_closed:
            raise RendezvousClosedError(f"the rendezvous handler for {self.run_id!r} is closed")
        result = self._result
        if result is None:
            raise RendezvousError("wait_for_change() needs a completed round: call next_rendezvous")
        round_ = result.round
        if self._closed_seen:
            return RendezvousEvent(RendezvousEventKind.CLOSED, round_, 0)
        keeper = self._keeper
        if self._error is not None or keeper is None or keeper.lost:
            return RendezvousEvent(RendezvousEventKind.ERROR, round_, 0, error=self._error)
        keys = self._keys
        members = self._round_record
        assert members is not None
        try:
            with keeper.guard(), self._translate("wait_for_change"):
                if self._member_watch is None:
                    watch = self._store.watch(keys.root, start_revision=self._member_revision + 1)
                    try:
                        await watch.start()
                        # counted once; the watch's events keep the counts (no reads per event)
                        live, waiting = await self._registrations(round_)
                    except BaseException:
                        with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                            await watch.aclose()
                        raise
                    self._member_watch = watch
                    self._member_counts = _Counts(keys, round_, live, waiting)
                counts = self._member_counts
                assert counts is not None
                async for event in self._member_watch:
                    counts.apply(event)
                    change = self._interpret(event, round_, members, counts)
                    if change is not None:
                        self._emit_change(change)
                        return change
        except LeaseExpiredError as exc:
            self._error = exc
            self._note_status()
            return RendezvousEvent(RendezvousEventKind.ERROR, round_, 0, error=exc)
        if self._handler_closed:
            raise RendezvousClosedError(f"the rendezvous handler for {self.run_id!r} is closed")
        raise RendezvousConnectionError(f"the watch of {self.run_id!r} ended")  # pragma: no cover

    def _emit_change(self, change: RendezvousEvent) -> None:
        kind = _CHANGE_KINDS[change.kind]
        fields: dict[str, Any] = {"round": change.round, "revision": change.revision}
        if change.kind is RendezvousEventKind.PARTICIPANT_LOST:
            fields["member"] = change.node_id
        elif change.kind is RendezvousEventKind.NODES_WAITING:
            fields["waiting_node"] = change.node_id
        if change.kind in (RendezvousEventKind.PARTICIPANT_LOST, RendezvousEventKind.NODES_WAITING):
            fields["num_nodes_waiting"] = change.num_nodes_waiting
        if change.kind is RendezvousEventKind.CLOSED:
            fields["by_this_node"] = False
        self._emit(kind, **fields)
        self._note_status()

    def _interpret(
        self, event: WatchEvent, round_: int, members: RoundRecord, counts: _Counts
    ) -> RendezvousEvent | None:
        keys, kv = self._keys, event.kv
        put = event.type is EventType.PUT
        if kv.key == keys.closed and put:
            if not self._closed_by(ClosedRecord.decode(kv.key, kv.value)):
                return None
            self._closed_seen = True
            return RendezvousEvent(RendezvousEventKind.CLOSED, round_, event.revision)
        if kv.key == keys.round and put:
            record = RoundRecord.decode(kv.key, kv.value)
            if record.round > round_:
                return RendezvousEvent(RendezvousEventKind.ROUND_SUPERSEDED, round_, event.revision)
            return None
        parsed = keys.parse_node_key(kv.key)
        if parsed is None:
            return None
        node_round, node = parsed
        if node_round == round_ + 1 and put:
            NodeRecord.decode(kv.key, kv.value)
            self._rejoined.add(node)
            waiting = self._waiting(counts.live, counts.waiting, len(members.members))
            if waiting:
                return RendezvousEvent(
                    RendezvousEventKind.NODES_WAITING,
                    round_,
                    event.revision,
                    node_id=node,
                    num_nodes_waiting=waiting,
                )
            return None
        if (
            node_round == round_
            and not put
            and members.rank_of(node) is not None
            and node != self._node_id
        ):
            if node in self._rejoined or node in self._lost:
                return None
            self._lost.add(node)
            waiting = self._waiting(counts.live, counts.waiting, len(members.members))
            return RendezvousEvent(
                RendezvousEventKind.PARTICIPANT_LOST,
                round_,
                event.revision,
                node_id=node,
                num_nodes_waiting=waiting,
            )
        return None
