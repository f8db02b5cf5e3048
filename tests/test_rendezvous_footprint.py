"""What a dynamic join creates and keeps alive, counted (white-box): with 10,000 participants in
one process (``python -m benchmarks.scale --mode memory``), every task a join creates is
multiplied by N, and every object a handler keeps is traversed by each full collection.

A join's own tasks are the reads of its control watch (one per event it waits for) and, for the
first join of a handler made directly, its lease grant (the driver adds one). A read is started
only when the join waits: the event that completes the join leaves no read behind to cancel.
Each callback the loop runs for a join (a task's step, a wake-up) is a loop turn's work, also
multiplied by N.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any

import pytest

from aioelastic.rendezvous._state import RoundRecord
from aioelastic.store import MemoryEngine
from aioelastic.testing import run_virtual
from benchmarks.scale import make_handlers

N = 200


def _tasks_per_join(rounds: int) -> list[float]:
    """Tasks created per join in each of ``rounds`` rounds of N (the first: fresh handlers),
    ``asyncio.gather``'s own task per join aside."""

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        created = 0

        def factory(
            loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
        ) -> asyncio.Task[Any]:
            nonlocal created
            created += 1
            return asyncio.Task(coro, loop=loop, **kw)

        loop.set_task_factory(factory)  # type: ignore[arg-type]
        handlers = make_handlers(MemoryEngine(), N)
        per_join = []
        for _ in range(rounds):
            before = created
            await asyncio.gather(*(h.next_rendezvous() for h in handlers))
            per_join.append((created - before - N) / N)
        await asyncio.gather(*(h.aclose() for h in handlers))
        return per_join

    return run_virtual(main())


def test_a_join_creates_a_task_per_control_event_it_waits_for_and_no_more() -> None:
    first, rejoin = _tasks_per_join(2)
    # first join: its lease grant and the reads of the driver's claim and of the round record
    # (the driver's own task is 1/N); the old code also left a third read to cancel: 4
    assert first <= 3 + 2 / N, first
    # rejoin: the kept lease and view; the two reads (the old code: 3)
    assert rejoin <= 2 + 2 / N, rejoin


def _callbacks_per_warm_join(n: int) -> float:
    """Callbacks scheduled on the loop (``call_soon``: task steps, wake-ups, done-callbacks) per
    warm join of a round of ``n`` (every node rejoins; no last call), the test's own one aside."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        handlers = make_handlers(MemoryEngine(), n, last_call_timeout=0)
        await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        count = 0
        call_soon = loop.call_soon

        def counting(*args: Any, **kw: Any) -> asyncio.Handle:
            nonlocal count
            count += 1
            return call_soon(*args, **kw)

        loop.call_soon = counting  # type: ignore[method-assign,assignment]
        try:
            joins = [asyncio.ensure_future(h.next_rendezvous()) for h in handlers]
            await asyncio.wait(joins)
        finally:
            del loop.call_soon
        for join in joins:
            join.result()
        await asyncio.gather(*(h.aclose() for h in handlers))
        return count / n

    return run_virtual(main())


def test_a_warm_join_wakes_the_joiner_directly() -> None:
    """The control watch's read and the driver wake the waiting join in their own last step,
    not through a done-callback run a loop turn later (which then woke the join one turn later
    still); a wait for tasks already done is skipped (it cost a turn)."""
    # a round of one (the driver): 5 since the join takes its events from the watch, which
    # wakes it (session 8: 10; before it, 13)
    alone = _callbacks_per_warm_join(1)
    assert alone <= 5.0, alone
    # most joins are members': about 3.03 at N = 64 (session 8: 8.05; before it, 9.08)
    members = _callbacks_per_warm_join(64)
    assert members <= 3.5, members


def test_a_rejoin_round_encodes_its_round_record_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver of a rejoin round writes the round record and, with it, the same bytes as the
    last round's next-round marker: one JSON encode (the old code encoded it twice)."""
    encodes = 0
    encode = RoundRecord.encode

    def counting(record: RoundRecord) -> bytes:
        nonlocal encodes
        encodes += 1
        return encode(record)

    monkeypatch.setattr(RoundRecord, "encode", counting)

    async def main() -> list[int]:
        handlers = make_handlers(MemoryEngine(), 4, last_call_timeout=0)
        per_round = []
        for _ in range(3):  # a first round, then two rejoin rounds (each with a marker)
            before = encodes
            await asyncio.gather(*(h.next_rendezvous() for h in handlers))
            per_round.append(encodes - before)
        await asyncio.gather(*(h.aclose() for h in handlers))
        return per_round

    assert run_virtual(main()) == [1, 1, 1]


def test_every_member_shares_the_decoded_round_and_driver_records() -> None:
    """The round record and the driver claim reach every node of a process as the same event:
    they are decoded once, not once per node (N objects kept, N JSON decodes)."""

    async def main() -> tuple[int, int]:
        handlers = make_handlers(MemoryEngine(), N)
        await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        rounds = {id(h._round_record) for h in handlers}
        views = [h._joiner._kept for h in handlers]
        drivers = {id(v.driver) for v in views if v is not None}
        await asyncio.gather(*(h.aclose() for h in handlers))
        return len(rounds), len(drivers)

    assert run_virtual(main()) == (1, 1)


def test_a_member_keeps_few_objects_after_its_round() -> None:
    """Objects the collector tracks that a handler keeps after a completed round (its lease and
    keeper, the kept view of ``c/`` and its watch, its result), per handler; the old code kept its
    own decoded copy of the round and driver records."""

    async def main() -> float:
        engine = MemoryEngine()
        gc.collect()
        base = len(gc.get_objects())
        handlers = make_handlers(engine, N)
        await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        gc.collect()
        kept = (len(gc.get_objects()) - base) / N
        await asyncio.gather(*(h.aclose() for h in handlers))
        return kept

    # about 37.1 (the old code: 39.2): what the handler is made of and what the round left
    kept = run_virtual(main())
    assert kept <= 38.0, kept


def test_a_waiting_member_keeps_few_objects() -> None:
    """Objects the collector tracks per member waiting for a round that has not formed yet (min
    nodes not reached): the 10,000 members of ``benchmarks.scale --mode memory`` are each
    traversed by every full collection while the round forms. Its join's task and coroutines,
    the watch read's task, lease, keeper and its guard, the kept view, the engine's watcher and
    lease records."""

    async def main() -> float:
        engine = MemoryEngine()
        handlers = make_handlers(engine, N + 1)[:N]  # min = max = N + 1: every one waits
        gc.collect()
        base = len(gc.get_objects())
        joins = [asyncio.ensure_future(h.next_rendezvous()) for h in handlers]
        await asyncio.sleep(1)  # (virtual time: every join registered and waits)
        assert not any(j.done() for j in joins)
        gc.collect()
        kept = (len(gc.get_objects()) - base) / N
        for join in joins:
            join.cancel()
        await asyncio.gather(*joins, return_exceptions=True)
        await asyncio.gather(*(h.aclose() for h in handlers))
        return kept

    # about 53.2: 54.2 with the handler's error translation a generator context manager, 58.2
    # while the join's frame kept its finished lease-grant task (a task, its context and
    # coroutine), 59.2 with a closure waking the wait, 62.2 before the keeper's guard was a
    # slotted class
    kept = run_virtual(main())
    assert kept <= 54.0, kept


def test_a_warm_join_enters_one_cancel_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    """anyio's cancel scopes entered per warm join of a round of one (its driver's): the lease
    guard's only (each scope looks up the current task and the backend: ~20 calls). The driver's
    write of the round was in a shielding scope too, which protected nothing on asyncio (the
    driver's task is in no anyio scope, and a native cancel goes through a shield)."""
    from anyio._backends._asyncio import CancelScope  # (what anyio.CancelScope() makes)

    entered = 0
    enter = CancelScope.__enter__

    def counting(scope: CancelScope) -> CancelScope:
        nonlocal entered
        entered += 1
        return enter(scope)

    async def main() -> float:
        (handler,) = make_handlers(MemoryEngine(), 1, last_call_timeout=0)
        await handler.next_rendezvous()
        monkeypatch.setattr(CancelScope, "__enter__", counting)
        for _ in range(10):
            await handler.next_rendezvous()
        monkeypatch.undo()
        await handler.aclose()
        return entered / 10

    per_join = run_virtual(main())
    assert per_join == 1.0, per_join  # (the old code: 2)


def test_a_warm_join_looks_the_running_loop_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``asyncio.get_running_loop()`` per warm join of a round of one: the join's own look-up,
    handed to its tasks, its driver and its result, and anyio's (its backend's, for the lease
    guard's scope). Each look-up is a ``getpid()`` system call on CPython 3.11; the old code
    made seven."""
    looked_up = 0
    get_running_loop = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        nonlocal looked_up
        looked_up += 1
        return get_running_loop()

    async def main() -> float:
        (handler,) = make_handlers(MemoryEngine(), 1, last_call_timeout=0)
        await handler.next_rendezvous()
        monkeypatch.setattr(asyncio, "get_running_loop", counting)
        for _ in range(10):
            await handler.next_rendezvous()
        monkeypatch.undo()
        await handler.aclose()
        return looked_up / 10

    per_join = run_virtual(main())
    assert per_join <= 2.0, per_join
