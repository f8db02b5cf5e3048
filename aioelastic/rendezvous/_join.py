"""The join coordinator of the dynamic rendezvous: ``next_rendezvous`` after its checks.

A join follows the control view (:class:`~._control.ControlView`) until a round completes with
this node in it: it registers for the round after the latest completed one, claims the driver
when nobody holds it (and then runs :class:`~._driver.RoundDriver`), becomes a standby when the
latest round is full, reopens a closed run when asked to, and withdraws its registration when
the join does not complete (an error, a timeout, a cancellation, the handler's close).
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import AbstractEventLoop
from typing import TYPE_CHECKING

import anyio

from ..errors import (
    CompactedError,
    LeaseNotFoundError,
    RendezvousClosedError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousTimeoutError,
    StoreError,
    WriteOutcomeUnknownError,
)
from ..events import NullSink
from ..store import Compare, Delete, Get, GetResult, KeyValue, Put, PutResult
from ._addr import default_addr, free_port
from ._claim import Claim, Claimed, claim_driver, claim_ops, claimed, own_claim
from ._control import ControlView
from ._driver import RoundDriver
from ._state import ClosedRecord, NodeRecord, RoundRecord, read_rank, read_roster
from ._tasks import WAKE_CONTEXT, JoinTasks, resolve
from .api import RendezvousResult, RendezvousStoreInfo

#: Seconds a handler's creation spends on the first join's work at most (``prepare``).
PREPARE_BUDGET = 2.0

if TYPE_CHECKING:
    from ..store import LeaseKeeper
    from .dynamic import DynamicRendezvousHandler

log = logging.getLogger("aioelastic.rendezvous")


class JoinCoordinator:
    """The joins of ``handler``: its registration, standby state and kept control view.

    ``record_round`` is the round this node's record is registered for (None: none).
    """

    def __init__(self, handler: DynamicRendezvousHandler) -> None:
        self._h = handler
        self.record_round: int | None = None
        self.standby = False
        self._kept: ControlView | None = None  # the view of c/, kept from a completed join
        self._closing: asyncio.Future[None] | None = None  # resolved by interrupt()
        self._tasks: JoinTasks | None = None  # the pending join's (interrupt() wakes it)
        self._driver: RoundDriver | None = None  # this join's driver, if it drives
        self._driven: int | None = None  # the round this join's driver ran for
        self._standby_of: int | None = None  # a round this node registered for, not chosen
        self._armed = False  # the lease's loss is the handler's (records are bound to it)

    # -- run and close state

    def is_new(self) -> bool:
        """Whether this handler has not taken part in the run yet (no round, no registration)."""
        return self._h._round < 0 and self.record_round is None

    def closed_by(self, record: ClosedRecord) -> bool:
        """Whether a close record closes the run for this handler.

        A plain close closes it for everyone. After a reopen, it still closes it for the nodes of
        the closed generation (those that took part in a round up to ``record.round``).
        """
        if not record.reopened:
            return True
        if self.is_new():
            return False
        round_ = self._h._round
        mine = round_ if self.record_round is None else max(round_, self.record_round)
        return mine <= record.round

    def interrupt(self) -> None:
        """The handler is closing: a pending join withdraws and raises."""
        if self._closing is not None:
            resolve(self._closing)
        if self._tasks is not None:
            self._tasks.wake()

    async def prepare(self) -> None:
        """Open the view of ``c/`` now (the store's first connection) and grant the lease, for
        the first join: it then registers at once, as a rejoin does."""
        h = self._h
        # Only a head start: a store that does not answer yet (its client retries connecting,
        # and says so) is left to the join, whose wait the caller can stop (SIGTERM, a timeout).
        with anyio.move_on_after(PREPARE_BUDGET) as scope:
            # the lease is granted while the view opens: their requests go in one message
            granting = None
            if h._keeper is None:
                granting = asyncio.get_running_loop().create_task(
                    self._prepare_lease(), name="aioelastic-rdzv-lease"
                )
            try:
                try:
                    if self._kept is None:
                        self._kept = await ControlView.open(h._store, h._keys)
                    if granting is not None:
                        await granting
                finally:
                    await _settle(granting)
            except (StoreError, RendezvousError) as exc:  # the join does it again, and says so
                log.debug("run %r: the first join's work was not done early: %s", h.run_id, exc)
        if scope.cancelled_caught:
            log.debug("run %r: no answer within %gs of creation", h.run_id, PREPARE_BUDGET)

    async def _prepare_lease(self) -> LeaseKeeper:
        # not armed: its loss before the join registers is not the handler's (the join grants
        # another); kept (and closed) by the handler once granted, even if the view failed
        keeper = self._h._keeper = await self._new_lease()
        return keeper

    async def aclose(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            await kept.aclose()
        self.record_round = None

    # -- a join

    async def join(self) -> RendezvousResult:
        """Take part in rounds under this node's lease until one completes with it.

        The view of ``c/`` and its watch outlive a completed join: the next join goes on from
        them, without opening a watch or reading ``c/`` again. A first join opens the watch and
        reads ``c/`` while the lease is granted (one round trip less).
        """
        h = self._h
        loop = asyncio.get_running_loop()  # (once: each look-up is a getpid() call on 3.11)
        h._stats.joins += 1
        h._stats.join_started = loop.time()
        deadline = loop.time() + h._join_timeout
        ctl, self._kept = self._kept, None
        completed = False
        granting = None
        if h._keeper is None or h._keeper.lost:
            granting = loop.create_task(self._grant_lease(), name="aioelastic-rdzv-lease")
        elif not self._armed:  # granted early (prepare): from now on our records are on it
            self._armed = True
            h._keeper.on_lost(h._on_lease_lost)
        try:
            try:
                if ctl is None:
                    ctl = await ControlView.open(h._store, h._keys)
                keeper = await granting if granting is not None else h._keeper
            finally:
                await _settle(granting)
            granting = None  # a finished task, kept by this frame for the whole wait otherwise
            assert keeper is not None
            with keeper.guard():  # our records vanish with the lease: stop waiting then
                result = await self._take_part(keeper, ctl, deadline, loop)
            completed = True
            return result
        finally:
            if ctl is not None:
                if completed and ctl.usable and not h._handler_closed:
                    self._kept = ctl
                else:
                    await ctl.aclose()

    async def _grant_lease(self) -> LeaseKeeper:
        h = self._h
        keeper = h._keeper
        if keeper is not None:  # lost: our records went with it
            self.record_round = None
            h._keeper = None
            await keeper.aclose(revoke=False)
        keeper = await self._new_lease()
        keeper.on_lost(h._on_lease_lost)
        self._armed = True
        h._keeper = keeper
        return keeper

    async def _new_lease(self) -> LeaseKeeper:
        h = self._h
        keeper = h._store.lease(h._lease_ttl, keep_alive_interval=h._keep_alive_interval)
        await keeper.start()
        return keeper

    async def _take_part(
        self, keeper: LeaseKeeper, ctl: ControlView, deadline: float, loop: AbstractEventLoop
    ) -> RendezvousResult:
        if self._closing is None:
            self._closing = loop.create_future()
        closing = self._closing
        if self._h._handler_closed:
            resolve(closing)  # aclose() came before the future existed (lease grant)
        self._driver = self._driven = None
        result: RendezvousResult | None = None
        tasks = JoinTasks(ctl.watch, loop)  # control events are read from now on
        self._tasks = tasks
        timed_out: asyncio.Future[None] = loop.create_future()  # one timer, not one per wait
        timer = loop.call_at(deadline, _time_up, self, tasks, timed_out, context=WAKE_CONTEXT)
        try:
            while (result := await self._step(keeper, ctl, tasks)) is None:
                await self._wait(tasks, closing, timed_out)
            return result
        finally:
            timer.cancel()
            self._tasks = None
            await self._end(tasks, ctl, keeper, completed=result is not None)

    async def _step(
        self, keeper: LeaseKeeper, ctl: ControlView, tasks: JoinTasks
    ) -> RendezvousResult | None:
        """Act on the view: the completed round with this node in it, or register and claim."""
        while True:
            await self._apply_read(ctl, tasks)
            blocked = await _check_closed(self, ctl)
            latest = ctl.round
            if self._is_mine(latest) and ctl.round_kv is not None:
                assert latest is not None
                result = await self._if_chosen(latest, ctl.round_kv.mod_revision)
                if result is not None:
                    return result
                self._standby_of = latest.round  # not chosen: registers for the next round
            target = 0 if latest is None else latest.round + 1
            claim: Claimed | None = None
            claimable = not blocked and tasks.driver is None and self._driven != target
            if not blocked and self.record_round != target:
                if await _buffered(tasks):
                    continue  # apply it first: the registration may carry a claim (below)
                self.standby = await _arrives_as_standby(self._h, latest)
                # the driver claim, when nobody holds it, goes in the registration's request
                ops = claim_ops(self._h, ctl, target, keeper) if claimable else None
                claim = await _register(self, target, keeper, ops)
                if claimable and ops is None:
                    claim = own_claim(self._h, ctl, target, keeper)
            elif claimable:
                if await _buffered(tasks):
                    # An event arrived (or was buffered in a kept watch): apply it before
                    # claiming the driver, so that nodes joining together do not all send a
                    # claim doomed to fail once the first one has landed.
                    continue
                claim = await claim_driver(self._h, ctl, target, keeper)
            tasks.driver_failed()  # a driver that failed fails the join
            if claim is not None:
                self._driven = target
                self._driver = RoundDriver(
                    self._h,
                    target,
                    ctl.round_kv,
                    claim.revision,
                    claim.snapshot,
                    prev_roster=claim.roster,
                    told=claim.told,
                    loop=tasks.loop,
                )
                tasks.drive(self._driver.run(), name=f"aioelastic-rdzv-driver-{target}")
            return None

    async def _apply_read(self, ctl: ControlView, tasks: JoinTasks) -> None:
        """Apply the control event read, if one is. The next read starts when the join waits
        (or looks for a buffered event): an event that completes the join leaves no read to
        cancel, and the kept watch holds what comes after it."""
        if not tasks.event_ready():
            return
        try:
            event = tasks.event()
        except CompactedError:
            await ctl.resync(self._h._store)
            tasks.retarget(ctl.watch)
            return
        assert event is not None
        ctl.apply_event(event)

    def _is_mine(self, latest: RoundRecord | None) -> bool:
        """Whether ``latest`` is the round this node registered for (it may be chosen in it)."""
        return (
            latest is not None
            and latest.round > self._h._round
            and latest.round == self.record_round
            and self._standby_of != latest.round
        )

    async def _if_chosen(self, record: RoundRecord, revision: int) -> RendezvousResult | None:
        """The result of ``record``'s round if this node is a member (None: a standby).

        The round record has no member list: this node's rank comes from its driver (when it
        drove the round), from the roster (read whole only for ``participants``), or from its
        member record (one small get); a member of the round before that no member left has
        them already (its rank, and the roster if the round is as large): it reads nothing.
        """
        h = self._h
        store, keys, node_id = h._store, h._keys, h.node_id
        participants: tuple[str, ...] = ()
        driver = self._driver
        if driver is not None and driver.target == record.round and driver.ranks is not None:
            rank = driver.ranks.get(node_id)  # it wrote the round: nothing to read
            if h._with_participants and driver.members is not None:
                participants = driver.members
        elif h._with_participants:  # (h._result: a round that kept them all reads nothing)
            participants = await read_roster(store, keys, record, h._result)
            rank = participants.index(node_id) if node_id in participants else None
        else:
            rank = await read_rank(store, keys, record, node_id, h._result)
        if rank is None:
            return None
        loop = None if self._tasks is None else self._tasks.loop  # (this join's: no look-up)
        return completed(h, record, rank, participants, revision, loop)

    async def _wait(
        self, tasks: JoinTasks, closing: asyncio.Future[None], timed_out: asyncio.Future[None]
    ) -> None:
        """Wait for a control event, the driver's end, the handler's close or the deadline."""
        h = self._h
        timing = not self.standby  # a standby waits without a join timeout
        await (tasks.wait(closing, timed_out) if timing else tasks.wait(closing))
        if closing.done():
            raise RendezvousClosedError(
                f"the rendezvous handler for {h.run_id!r} was closed while joining"
            )
        if timing and timed_out.done():
            raise RendezvousTimeoutError(
                f"the rendezvous {h.run_id!r} did not complete within "
                f"join_timeout={h._join_timeout}s"
            )

    async def _end(
        self, tasks: JoinTasks, ctl: ControlView, keeper: LeaseKeeper, *, completed: bool
    ) -> None:
        # Our driver wrote the round record we read, and the store's answer to that write can
        # arrive after the watch event (etcd, http): let it finish (count the round, drop the
        # previous round's data) instead of cancelling it mid-write. (A driver still counting
        # lost the round to an earlier driver: it is cancelled.)
        finishing = completed and self._driver is not None and self._driver.finalizing
        unread = await tasks.aclose(let_driver_finish=self._h._close_timeout if finishing else None)
        self._driver = None
        # an event read but not applied: the view must not miss it (the watch is kept)
        if isinstance(unread, BaseException):
            ctl.usable = False
        elif unread is not None:
            ctl.apply_event(unread)
        if not completed:
            await _withdraw(self, keeper)


# -- the writes of a join


async def _register(
    j: JoinCoordinator, target: int, keeper: LeaseKeeper, claim: Claim | None = None
) -> Claimed | None:
    """Register ``j``'s node for ``target``, leaving the round it was registered for, and claim
    the driver with it (``claim``, one request): the claim (and the registrations it read) if
    this node now drives, else None."""
    h = j._h
    store, keys, node_id = h._store, h._keys, h.node_id
    addr = h._local_addr or default_addr()
    record = NodeRecord(node_id, addr, free_port()).encode()
    key = keys.node(target, node_id)
    old = j.record_round
    leaving = old is not None and old != target
    try:
        if claim is not None:
            drives = await _register_claiming(j, target, record, keeper, claim)
        elif leaving:  # register and leave the round we were in, in one request
            assert old is not None
            result = await store.txn(
                compare=[Compare.mod_revision(key) == 0],
                success=[Put(key, record, keeper.id), Delete(keys.node(old, node_id))],
                failure=[Get(key)],
            )
            succeeded, kv = result.succeeded, None
            if not succeeded:
                got = result[0]
                assert isinstance(got, GetResult)
                kv = got.kv
        else:
            cas = await store.compare_and_swap(key, 0, record, lease=keeper.id)
            succeeded, kv = cas.succeeded, cas.kv
    except WriteOutcomeUnknownError:
        j.record_round = target  # it may have applied: a withdrawal deletes it
        raise
    if claim is not None:
        j.record_round = target
        return drives
    if not succeeded and (kv is None or kv.lease != keeper.id):
        raise _duplicate(h, target)
    j.record_round = target
    if leaving and not succeeded:  # registered already (by this lease): leave the old round
        assert old is not None
        await store.delete(keys.node(old, node_id))
    return None


async def _register_claiming(
    j: JoinCoordinator, target: int, record: bytes, keeper: LeaseKeeper, claim: Claim
) -> Claimed | None:
    """Register for ``target`` (leaving the old round) and claim the driver, in one transaction:
    the registration in either branch; the claim, and reads of the registrations present and of
    the last round's roster (the driver's count starts from them: no read of its own), only if
    ``c/driver`` is as the view saw it.

    A transaction has one condition, so the registration cannot also require its key to be
    absent: the record the put replaced says whether another live handler holds this node id (a
    misconfiguration), and then it is put back and the join fails, as without a claim.
    """
    h = j._h
    key, old = h._keys.node(target, h.node_id), j.record_round
    ops: list[Put | Delete] = [Put(key, record, keeper.id)]
    if old is not None and old != target:
        ops.append(Delete(h._keys.node(old, h.node_id)))
    success = [*ops, *claim.puts, *claim.reads]
    result = await h._store.txn(compare=[claim.compare], success=success, failure=ops)
    registered = result[0]
    assert isinstance(registered, PutResult)
    prev = registered.prev_kv
    if prev is not None and prev.lease != keeper.id:
        await _put_back(h, registered.kv, prev)  # (our claim, if made, goes with the withdrawal)
        raise _duplicate(h, target)
    return claimed(claim, result, len(ops)) if result.succeeded else None


async def _put_back(h: DynamicRendezvousHandler, ours: KeyValue, theirs: KeyValue) -> None:
    """Restore another handler's registration that ours replaced (if nothing changed it since;
    if its lease has gone, drop ours instead)."""
    store = h._store
    unchanged = Compare.mod_revision(ours.key) == ours.mod_revision
    try:
        await store.txn(compare=[unchanged], success=[Put(ours.key, theirs.value, theirs.lease)])
    except LeaseNotFoundError:
        await store.compare_and_delete(ours.key, ours.mod_revision)


def _duplicate(h: DynamicRendezvousHandler, target: int) -> RendezvousError:
    return RendezvousError(
        f"node id {h.node_id!r} is already registered for round {target} of "
        f"{h.run_id!r} by another live handler"
    )


async def _withdraw(j: JoinCoordinator, keeper: LeaseKeeper) -> None:
    """Undo a join that did not complete: drop our registration and driver claim."""
    h = j._h
    if keeper.lost or h._store.closed:
        j.record_round = None
        return
    store, keys = h._store, h._keys
    with anyio.move_on_after(h._close_timeout, shield=True):
        try:
            # our registration, and our record as a member of the round we were leaving
            for round_ in {j.record_round, h._round} - {None, -1}:
                assert round_ is not None
                await store.delete(keys.node(round_, h.node_id))
            j.record_round = None
            kv = await store.get(keys.driver)
            if kv is not None and kv.lease == keeper.id:
                await store.compare_and_delete(keys.driver, kv.mod_revision)
        except (StoreError, RendezvousError) as exc:
            log.warning("could not withdraw %s from %r: %s", h.node_id, h.run_id, exc)


def completed(
    h: DynamicRendezvousHandler,
    record: RoundRecord,
    rank: int,
    participants: tuple[str, ...],
    revision: int,
    loop: AbstractEventLoop | None = None,
) -> RendezvousResult:
    """``h``'s result of ``record``'s round (completed at ``revision``), as its rank ``rank``
    (``loop``: the running one, if the caller has it)."""
    h._joiner.standby = False
    result = RendezvousResult(
        run_id=h.run_id,
        round=record.round,
        rank=rank,
        world_size=record.world_size,
        participants=participants,
        node_id=h.node_id,
        store=h._store.namespace(h._keys.data(record.round)),
        bootstrap_store_info=RendezvousStoreInfo(record.master_addr, record.master_port),
        departed=record.departed,
    )
    h._round, h._round_record, h._result = record.round, record, result
    h._members.reset(revision)
    h._stats.completed_at = now = (loop or asyncio.get_running_loop()).time()
    if isinstance(h.event_sink, NullSink):
        return result  # (an event nobody takes is not built: every join completes one)
    started = h._stats.join_started
    h._emit(
        "rendezvous.round_completed",
        round=record.round,
        rank=rank,
        world_size=record.world_size,
        participants=list(participants),
        master_addr=record.master_addr,
        master_port=record.master_port,
        duration=None if started is None else round(now - started, 6),
    )
    return result


def _time_up(j: JoinCoordinator, tasks: JoinTasks, timed_out: asyncio.Future[None]) -> None:
    """The join's deadline: a join that is not a standby's stops waiting (a standby waits on)."""
    resolve(timed_out)
    if not j.standby:
        tasks.wake()


async def _settle(task: asyncio.Task[LeaseKeeper] | None) -> None:
    """End a lease grant the join no longer waits for, and retrieve its outcome."""
    if task is None:
        return
    if not task.done():
        task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: a failure was raised by the join, or is moot


async def _arrives_as_standby(h: DynamicRendezvousHandler, latest: RoundRecord | None) -> bool:
    """Whether a node arrives as a standby: the latest round is full and all alive."""
    if latest is None or latest.world_size < h._max or latest.round == h._round:
        return False
    live = await h._store.range(h._keys.nodes_of(latest.round), limit=1)
    return live.count >= h._max


async def _check_closed(j: JoinCoordinator, ctl: ControlView) -> bool:
    """Whether the view shows a close of the run: raise, or reopen it (``reopen_closed``)."""
    h = j._h
    blocked = ctl.closed is not None and j.closed_by(ctl.closed)
    if blocked and ctl.closed_kv is not None:
        if h._reopen_closed and j.is_new() and not h._closed_seen:
            await _reopen(h, ctl.closed_kv)  # its write arrives as an event
        else:
            h._closed_seen = True
            if j.standby:
                raise RendezvousGracefulExitError(
                    f"the rendezvous {h.run_id!r} closed while this node was a standby"
                )
            raise RendezvousClosedError(f"the rendezvous {h.run_id!r} is closed")
    return blocked


async def _reopen(h: DynamicRendezvousHandler, closed: KeyValue) -> None:
    """Clear a close (``reopen_closed``): drop the closed generation's records, then the close
    record itself, both only if written before the close we saw."""
    store, keys = h._store, h._keys
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
        log.info("run %r was closed; reopened by %s", h.run_id, h.node_id)


async def _buffered(tasks: JoinTasks) -> bool:
    """Whether a control event is ready to apply (after letting the watch hand over what it
    holds: its reader task takes a loop turn; a watch whose events are taken shows them)."""
    if tasks.taking:
        return tasks.event_ready()
    tasks.read()
    if not tasks.event_ready():
        await asyncio.sleep(0)  # (anyio's checkpoint on asyncio, without its backend look-up)
    return tasks.event_ready()
