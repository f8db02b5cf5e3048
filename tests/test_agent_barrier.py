"""The agent's exit barrier: a node whose workers all succeeded waits for the others, and the
barrier's work is O(1) per node (one count, one key waited on), O(N) a round.

Real handlers over one memory engine, in virtual time (a barrier that only ends at its timeout
is seen by the clock, not by waiting)."""

from __future__ import annotations

import asyncio
from dataclasses import astuple

import pytest

from aioelastic.agent._membership import ALL_DONE, DONE, DONE_COUNT, Membership
from aioelastic.agent._stops import StopRequest
from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousResult
from aioelastic.store import MemoryEngine, MemoryStore
from aioelastic.store.memory import EngineWork
from aioelastic.testing import run_virtual

TIMEOUT = 300.0


async def _round(engine: MemoryEngine, n: int) -> list[tuple[Membership, RendezvousResult]]:
    handlers = [
        DynamicRendezvousHandler(
            MemoryStore(engine), "barrier", n, n, local_addr="127.0.0.1", owns_store=True
        )
        for _ in range(n)
    ]
    results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    members = [
        (Membership(h, lambda *a, **k: None), r) for h, r in zip(handlers, results, strict=True)
    ]
    # what the agent's monitor does while the workers run: it waits for a change (which opens
    # the member watch that the barrier's own wait then reuses)
    monitors = [asyncio.ensure_future(m.next_change(r)) for m, r in members]
    await asyncio.sleep(1.0)
    for monitor in monitors:
        monitor.cancel()
    await asyncio.gather(*monitors, return_exceptions=True)
    return members


def _stop() -> StopRequest:
    stop = StopRequest()
    stop.arm()
    return stop


async def _close(members: list[tuple[Membership, RendezvousResult]]) -> None:
    await asyncio.gather(*(m.handler.aclose() for m, _ in members))


def test_a_done_node_waits_for_the_last_one() -> None:
    async def main() -> None:
        engine = MemoryEngine()
        members = await _round(engine, 3)
        loop = asyncio.get_running_loop()
        start = loop.time()
        early = [asyncio.ensure_future(m.exit_barrier(r, TIMEOUT, _stop())) for m, r in members[:2]]
        await asyncio.sleep(10.0)
        assert not any(b.done() for b in early)  # two of three are done: both still wait
        last, rdzv = members[2]
        await last.exit_barrier(rdzv, TIMEOUT, _stop())
        await asyncio.gather(*early)
        assert loop.time() - start < 11.0  # released by the last node, not by the timeout
        store = rdzv.store
        assert (await store.get(ALL_DONE)) is not None
        count = await store.get(DONE_COUNT)
        assert count is not None
        assert int(count.value) == 3
        for _, r in members:
            assert (await store.get(DONE + r.node_id)) is not None
        await _close(members)

    run_virtual(main)


def test_a_lone_node_does_not_wait_or_count() -> None:
    async def main() -> None:
        members = await _round(MemoryEngine(), 1)
        (member, rdzv), loop = members[0], asyncio.get_running_loop()
        start = loop.time()
        await member.exit_barrier(rdzv, TIMEOUT, _stop())
        assert loop.time() - start < 1.0
        assert (await rdzv.store.get(DONE + rdzv.node_id)) is not None
        assert (await rdzv.store.get(ALL_DONE)) is None
        await _close(members)

    run_virtual(main)


async def _done_at(when: float, member: Membership, rdzv: RendezvousResult) -> None:
    await asyncio.sleep(when)  # the nodes' workers finish one after another
    await member.exit_barrier(rdzv, TIMEOUT, _stop())


def _barrier_work(n: int) -> EngineWork:
    async def main() -> EngineWork:
        engine = MemoryEngine()
        members = await _round(engine, n)
        before = engine.work()
        await asyncio.gather(*(_done_at(float(i), m, r) for i, (m, r) in enumerate(members)))
        after = engine.work()
        await _close(members)
        return EngineWork(*(a - b for a, b in zip(astuple(after), astuple(before), strict=True)))

    return run_virtual(main)


@pytest.mark.parametrize(
    "counter", ["events_delivered", "watcher_visits", "writes", "keys_scanned"]
)
def test_the_barrier_work_grows_linearly(counter: str) -> None:
    """A wait on every member's key delivers N events to each of N nodes (16-fold from N to
    4N); counting and one key to wait on deliver O(1) to each."""
    small, large = (getattr(_barrier_work(n), counter) for n in (10, 40))
    assert large <= 4 * 1.25 * max(small, 1), (counter, small, large)
