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
3. The driver writes the roster (``r/<round>/``, in chunks) and each member's record
   ``m/<round>/<node>`` (its rank, bound to that member's lease), then finalises the round by
   compare-and-swap of the small ``c/round`` (world size, rank 0's master address; no member
   list), all only while its claim holds. Every waiting node wakes on that one write (one small
   watch event each) and reads its own member record (one get). If the driver dies, its lease
   takes ``c/driver`` with it and a waiting node claims it.
4. A member watches ``m/<round>/`` only: if a member dies or leaves, its lease takes its record
   and the others get ``PARTICIPANT_LOST`` (torch misses this, #111646). The next round's
   driver tells them of the first member registering again and of each newcomer it could take
   (``NODES_WAITING``, with the count); a re-registration reaches the driver alone, so N members
   rejoining at once cost O(N) in all.
5. The watch of ``c/`` and the view it keeps outlive a completed join: the next join of the
   handler starts from them (no watch to open, nothing to read before registering), and applies
   what the watch holds before it claims the driver (no claim the watch shows was taken). A
   handler made by a registry creator opens them when it is created.

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
import gc
import importlib
import secrets
from typing import TYPE_CHECKING

import anyio

from .. import events as _events
from ..errors import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousTimeoutError,
)
from ._addr import looked_up_default_addr, prefetch_default_addr
from ._control import write_closed
from ._driver import assign_ranks, log
from ._join import JoinCoordinator
from ._membership import MemberWatch, count_waiting, wait_for_change
from ._reports import ReportingHandler, Stats
from ._state import ClosedRecord, RoundRecord, RunKeys, check_node_id
from .api import (
    RendezvousEvent,
    RendezvousResult,
    RendezvousStatus,
    translated,
)

if TYPE_CHECKING:
    from ..events import EventSink
    from ..store import LeaseKeeper, Store

__all__ = ["DEFAULTS", "DynamicRendezvousHandler", "assign_ranks"]

#: torch's defaults, in seconds (lease TTL = keep_alive_interval x keep_alive_max_attempt).
DEFAULTS = {
    "join_timeout": 600.0,
    "last_call_timeout": 30.0,
    "close_timeout": 30.0,
    "keep_alive_interval": 5.0,
    "keep_alive_max_attempt": 3,
}


def _check_settings(min_nodes: int, max_nodes: int, **seconds: tuple[float, bool]) -> None:
    """Validate the sizes, and each number of seconds (``(value, zero allowed)``)."""
    for name, value in (("min_nodes", min_nodes), ("max_nodes", max_nodes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if min_nodes < 1:
        raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
    if max_nodes < min_nodes:
        raise ValueError(f"max_nodes ({max_nodes}) must be >= min_nodes ({min_nodes})")
    for what, (secs, zero_ok) in seconds.items():
        if isinstance(secs, bool) or not isinstance(secs, (int, float)):
            raise TypeError(f"{what} must be a number of seconds, got {secs!r}")
        if not (secs >= 0 if zero_ok else secs > 0) or secs == float("inf"):
            raise ValueError(f"{what} must be a finite number of seconds > 0, got {secs}")


def _do_lazy_work_now(local_addr: str | None) -> None:
    """What a first join would otherwise do inside its round: the default address's DNS lookup
    (in a thread, from now) and anyio's backend import (on first use)."""
    if local_addr is None:
        prefetch_default_addr()
    with contextlib.suppress(ImportError):
        importlib.import_module("anyio._backends._asyncio")


class DynamicRendezvousHandler(ReportingHandler):
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
    ``participants`` (default on): each completed round reads its whole roster into
    :attr:`RendezvousResult.participants` (about 13 bytes per member, for every member: N^2 bytes
    a round in all); off, ``participants`` is ``()`` and a member reads only its own member
    record to find its rank (O(1) bytes), which is what rounds of thousands of nodes want.

    Its parts, each in a module of its own: the join coordinator (:mod:`._join`: registration,
    driver claim, standby, reopen, withdrawal), the driver of a forming round (:mod:`._driver`)
    and the change notification of a completed one (:mod:`._membership`). The host name a node
    publishes is looked up in a thread when the handler is created (not on the event loop).
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
        participants: bool = True,
        backend: str = "memory",
        owns_store: bool = False,
        event_sink: EventSink | None = None,
    ) -> None:
        _check_settings(
            min_nodes,
            max_nodes,
            join_timeout=(join_timeout, False),
            last_call_timeout=(last_call_timeout, True),
            close_timeout=(close_timeout, False),
            lease_ttl=(lease_ttl, False),
        )
        self._store = store
        self._keys = RunKeys(run_id)
        self._min, self._max = min_nodes, max_nodes
        self._join_timeout = float(join_timeout)
        self._last_call = float(last_call_timeout)
        self._close_timeout = float(close_timeout)
        self._lease_ttl = float(lease_ttl)
        self._keep_alive_interval = keep_alive_interval
        self._node_id = check_node_id(node_id) if node_id is not None else secrets.token_hex(6)
        self._local_addr = local_addr
        _do_lazy_work_now(local_addr)
        self._reopen_closed = reopen_closed
        self._fast_reform = bool(fast_reform)
        self._with_participants = bool(participants)
        self._backend = backend
        self._owns_store = owns_store
        self._keeper: LeaseKeeper | None = None
        self._lock = asyncio.Lock()
        self._round = -1  # the last round returned to this node
        self._result: RendezvousResult | None = None
        self._round_record: RoundRecord | None = None  # the round of self._result
        self._closed_seen = False
        self._handler_closed = False
        self._error: BaseException | None = None
        self._stats = Stats()
        self._joiner = JoinCoordinator(self)
        self._members = MemberWatch(self)
        self.event_sink = _events.resolve_sink(event_sink)
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
        """The lease that keeps this node's records alive (None before the first join, unless a
        registry creator prepared the handler: then it is granted with the handler)."""
        return self._keeper

    async def _prepare(self) -> None:
        """The one-time work of a first join, done when a creator makes the handler: the host
        name's lookup (off the loop), the view of ``c/`` (the store's first connection), and a
        full garbage collection, so that the first join does not pay for collecting the heap
        of a process's imports (70-80 ms under torch's on a 2-core machine)."""
        if self._local_addr is None:
            await looked_up_default_addr()
        await self._joiner.prepare()
        gc.collect()

    # -- the public operations

    async def next_rendezvous(self) -> RendezvousResult:
        """Wait until a round completes with this node in it; return this node's view of it.

        Raises :class:`~aioelastic.errors.RendezvousClosedError` if the run is (or gets) closed,
        :class:`~aioelastic.errors.RendezvousGracefulExitError` for a standby when it closes,
        :class:`~aioelastic.errors.RendezvousTimeoutError` after ``join_timeout`` (standbys
        excepted), :class:`~aioelastic.errors.RendezvousConnectionError` if the store fails.
        Cancelling it withdraws this node's registration.
        """
        self._check_usable()
        # (not ``async with`` the lock nor ``with self._translate()``: every waiting participant
        # would hold their bound __aexit__/__exit__ and the translator for the whole wait, three
        # objects more per participant for each full garbage collection to traverse)
        await self._lock.acquire()
        try:
            self._check_usable()
            await self._members.aclose()
            self._emit("rendezvous.join_started", previous_round=self._round)
            try:
                result = await self._joiner.join()
            except BaseException as exc:
                error = translated(self, "next_rendezvous", exc)
                failure = exc if error is None else error
                self._emit(
                    "rendezvous.join_failed",
                    previous_round=self._round,
                    error_type=type(failure).__name__,
                    error=str(failure),
                )
                self._note_status()
                if error is None:
                    raise
                raise error from exc
            self._error = None
            self._note_status()
            return result
        finally:
            self._lock.release()

    async def wait_for_change(self) -> RendezvousEvent:
        """Wait for the next change to the round last returned to this node.

        ``NODES_WAITING`` (the next round's driver saw the first member register again, or a
        newcomer it could take), ``PARTICIPANT_LOST`` (a member's lease ended, or it left),
        ``ROUND_SUPERSEDED``, ``CLOSED``, or ``ERROR`` (this node's lease was lost). Events are
        delivered once each, in store order; nothing polls.
        """
        return await wait_for_change(self)

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
            return await count_waiting(self._store, self._keys, self._max)

    async def is_closed(self) -> bool:
        """Whether the run is closed (this handler's own close state is sticky)."""
        if self._closed_seen:
            return True
        if self._handler_closed:
            raise RendezvousClosedError(f"the rendezvous handler for {self.run_id!r} is closed")
        with self._translate("is_closed"):
            kv = await self._store.get(self._keys.closed)
        if kv is None or not self._joiner.closed_by(ClosedRecord.decode(kv.key, kv.value)):
            return False
        if not (self._reopen_closed and self._joiner.is_new()):
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
                    record = await write_closed(self._store, self._keys)
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
        self._joiner.interrupt()
        async with self._lock:  # a pending join withdraws and returns first
            await self._members.aclose()
            await self._joiner.aclose()
            if self._keeper is not None:
                await self._keeper.aclose()
        self._note_status()
        if self._owns_store:
            await self._store.aclose()
