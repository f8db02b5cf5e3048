"""The agent's side of the rendezvous: join a round (saying once why a standby waits), watch the
membership for the changes that matter, wait a bounded while for the loss of a node that would
explain a failure, and the exit barrier of a node whose workers all succeeded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from .. import _hints
from ..errors import RendezvousError
from ..rendezvous import (
    RendezvousEvent,
    RendezvousEventKind,
    RendezvousHandler,
    RendezvousResult,
    read_standby_round,
)
from ._stops import Stopped, StopRequest, settle

__all__ = ["STANDBY_CHECK", "Membership", "describe_event", "is_loss"]

log = logging.getLogger("aioelastic.agent")

#: seconds a join may take before the agent looks once whether this node is a standby
STANDBY_CHECK = 3.0
DONE = "agent/done/"  # round-store keys: the nodes whose workers all succeeded
DONE_COUNT = "agent/done-count"  # how many of them there are (one add each)
ALL_DONE = "agent/all-done"  # written by the node whose add counted the last of them


def is_loss(change: asyncio.Future[RendezvousEvent]) -> bool:
    """Whether a finished change future holds a lost participant."""
    if change.cancelled() or change.exception() is not None:
        return False
    return change.result().kind is RendezvousEventKind.PARTICIPANT_LOST


def describe_event(event: RendezvousEvent | BaseException) -> str:
    if isinstance(event, BaseException):
        return f"rendezvous error ({type(event).__name__}: {event})"
    what = event.kind.value
    if event.node_id is not None:
        what += f" ({event.node_id})"
    if event.num_nodes_waiting:
        what += f", {event.num_nodes_waiting} node(s) waiting"
    return what


class Membership:
    """One handler's rounds as the agent sees them (``emit`` reports its ``agent.*`` events)."""

    def __init__(self, handler: RendezvousHandler, emit: Callable[..., None]) -> None:
        self.handler = handler
        self._emit = emit

    async def join(self) -> RendezvousResult:
        """``next_rendezvous()``; if it is still waiting after :data:`STANDBY_CHECK` seconds, say
        once why when this node is a standby (one status read, not a poll)."""
        join = asyncio.ensure_future(self.handler.next_rendezvous())
        try:
            done, _ = await asyncio.wait({join}, timeout=STANDBY_CHECK)
            if not done:
                await self._explain_wait()
            return await join
        finally:
            if not join.done():
                join.cancel()
                with contextlib.suppress(BaseException):
                    await join

    async def _explain_wait(self) -> None:
        """One read of the round record (O(1), not the run's every record): a full round without
        this node means it stands by."""
        handler = self.handler
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

    async def close_run(self) -> None:
        try:
            await self.handler.set_closed()
        except RendezvousError as exc:
            log.warning("could not close the run: %s", exc)

    async def next_change(self, rdzv: RendezvousResult) -> RendezvousEvent:
        """The next membership change that matters (a member that left done does not)."""
        while True:
            event = await self.handler.wait_for_change()
            if event.kind is RendezvousEventKind.PARTICIPANT_LOST and event.node_id is not None:
                with contextlib.suppress(Exception):
                    if await rdzv.store.get(DONE + event.node_id) is not None:
                        log.info("node %s finished and left", event.node_id)
                        continue
            return event

    async def loss_within(
        self, rdzv: RendezvousResult, window: float | None
    ) -> RendezvousEvent | None:
        """The loss of a node of ``rdzv`` seen within ``window`` seconds (``None``: the lease's
        TTL + 1 s), or None (see ``WorkerSpec.loss_window``)."""
        if rdzv.world_size < 2:
            return None  # nobody else to lose: the failure is the job's
        if window is None:
            keeper = getattr(self.handler, "lease", None)
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
            await settle(waiter)
        return waiter.result() if waiter.done() and is_loss(waiter) else None

    async def _next_loss(self, rdzv: RendezvousResult) -> RendezvousEvent:
        while True:
            event = await self.next_change(rdzv)
            if event.kind in (RendezvousEventKind.PARTICIPANT_LOST, RendezvousEventKind.CLOSED):
                return event

    async def exit_barrier(self, rdzv: RendezvousResult, timeout: float, stop: StopRequest) -> None:
        """Say this node is done; wait (bounded by ``timeout``, a membership change or a stop)
        for the others before leaving the round.

        O(1) per node, O(N) a round (not a wait on every member's key: N events to each of N
        nodes): each node counts itself with one ``add``, the one that counts the last node
        writes :data:`ALL_DONE`, and every node waits for that one key. ``DONE + node`` says
        that a member that left had finished (:meth:`next_change`)."""
        store, world = rdzv.store, rdzv.world_size
        try:
            # counted first: a node that dies between the two is counted all the same, and its
            # loss (no DONE key) ends the others' wait
            count = await store.add(DONE_COUNT, 1) if world > 1 else 1
            await store.put(DONE + rdzv.node_id, b"1")
            if world > 1 and count >= world:
                await store.put(ALL_DONE, b"1")
        except Exception as exc:  # best effort: leaving is what matters
            log.warning("exit barrier: could not record this node as done: %s", exc)
            return
        if world == 1:
            return
        wait = asyncio.ensure_future(store.wait_for([ALL_DONE], timeout=timeout))
        changes = asyncio.ensure_future(self.next_change(rdzv))
        tasks: list[asyncio.Future[Any]] = [wait, changes]
        try:
            await stop.until(asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED))
        except Stopped:
            pass
        finally:
            for task in tasks:
                task.cancel()
            await settle(wait, changes)
        if wait.done() and not wait.cancelled() and wait.exception() is None:
            log.info("exit barrier: every node is done")
        else:
            log.info("exit barrier: leaving without waiting for every node")
