"""``benchmarks/scale.py --kill`` on the memory store (``--mode memory`` or ``simulate``): one
member of a round of N lost, in one process, without a transport.

N handlers (min N - 1, max N) form a round over one memory engine; every member but one waits in
``wait_for_change``; the engine revokes the last one's lease (what ``aioelastic serve`` does once
a session's grace has passed after its connection ended, or what a lease's expiry does). Timed
and counted: from the revoke until every other member has returned ``PARTICIPANT_LOST``, then
their round of N - 1 (it never reaches max, but forms as soon as every survivor has registered
again, without waiting out its last call: ``fast_reform``, the handlers' default). What is left
is the library's own work on that path (the engine's revoke and fan-out, each member's wake-up
and its interpretation of the event, the rejoin), the part of the http figure that is not the
transport's. The work counters are the
engine's (:class:`~aioelastic.store.memory.EngineWork`), per survivor in the report.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aioelastic.rendezvous import RendezvousEventKind
from aioelastic.store.memory import EngineWork
from aioelastic.testing import run_virtual
from benchmarks.scale import CountingEngine, GcMeter, make_handlers

__all__ = ["LAST_CALL", "LossFigures", "loss_details", "lost_member", "run_loss"]

#: the handlers' last-call window (s), which the first round (min N - 1) must not end before its
#: N-th node registered; the round of N - 1 does not wait it out (``fast_reform``)
LAST_CALL = 0.5


@dataclass(frozen=True)
class LossFigures:
    """One member of a round of N lost: the loss seen by all (``seen_*``), then the round of
    N - 1 (``again_*``): wall and CPU seconds, and the engine's work (events delivered, watcher
    visits, writes) over each."""

    n: int
    seen_seconds: float
    seen_cpu_seconds: float
    seen_events: int
    seen_visits: int
    again_seconds: float
    again_cpu_seconds: float
    again_events: int
    again_visits: int
    again_writes: int
    #: CPU time in the cyclic garbage collector (over each), and its full collections
    seen_gc_seconds: float = 0.0
    again_gc_seconds: float = 0.0
    again_gc_full: int = 0


def _diff(after: EngineWork, before: EngineWork) -> tuple[int, int, int]:
    return (
        after.events_delivered - before.events_delivered,
        after.watcher_visits - before.watcher_visits,
        after.writes - before.writes,
    )


async def lost_member(n: int, history_limit: int | None = None) -> LossFigures:
    """The figures of one loss among N in-process members (see the module doc).

    ``history_limit``: the engine's (default: its default, 10,000 events). Below about 2 N, the
    members' watches of ``c/`` fall behind a compaction while the round of N - 1 writes its
    registrations and member records, and the members read ``c/`` afresh when they rejoin
    (``aioelastic serve`` in ``--mode http`` keeps 4 N)."""
    engine = (
        CountingEngine() if history_limit is None else CountingEngine(history_limit=history_limit)
    )
    handlers = make_handlers(engine, n, min_nodes=n - 1, last_call_timeout=LAST_CALL)
    survivors, victim = handlers[:-1], handlers[-1]
    try:
        results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        round_ = results[0].round
        # every member's watch open before the loss (what wait_for_change opens first): the
        # loss is then timed from the revoke alone, and no member can miss it
        await asyncio.gather(*(h._members._open(round_) for h in survivors))
        changes = [asyncio.ensure_future(h.wait_for_change()) for h in survivors]
        keeper = victim._keeper
        assert keeper is not None
        before = engine.work()
        with GcMeter() as seen_gc:
            start, cpu = time.perf_counter(), time.process_time()
            engine.lease_revoke(keeper.id)
            kinds = {event.kind for event in await asyncio.gather(*changes)}
            seen, seen_cpu = time.perf_counter() - start, time.process_time() - cpu
        if kinds != {RendezvousEventKind.PARTICIPANT_LOST}:
            raise AssertionError(f"the survivors saw {kinds}, not PARTICIPANT_LOST alone")
        middle = engine.work()
        with GcMeter() as again_gc:
            start, cpu = time.perf_counter(), time.process_time()
            again = await asyncio.gather(*(h.next_rendezvous() for h in survivors))
            again_s, again_cpu = time.perf_counter() - start, time.process_time() - cpu
        if sorted(r.rank for r in again) != list(range(n - 1)):
            raise AssertionError(f"the ranks of the round of {n - 1} are not 0..{n - 2}")
        seen_work, again_work = _diff(middle, before), _diff(engine.work(), middle)
    finally:
        await asyncio.gather(*(h.aclose() for h in handlers), return_exceptions=True)
        engine.close()
    return LossFigures(
        n,
        seen,
        seen_cpu,
        seen_work[0],
        seen_work[1],
        again_s,
        again_cpu,
        *again_work,
        seen_gc_seconds=seen_gc.seconds,
        again_gc_seconds=again_gc.seconds,
        again_gc_full=again_gc.full,
    )


def run_loss(n: int, history_limit: int | None = None, *, simulate: bool = False) -> LossFigures:
    """:func:`lost_member` on a loop of its own (``simulate``: the test kit's virtual-time one)."""
    lost = lost_member(n, history_limit)
    return run_virtual(lost) if simulate else asyncio.run(lost)


def loss_details(figures: list[LossFigures]) -> str:
    """A line per run: the loss, then the round of N - 1, with their work per survivor."""
    lines = []
    for f in figures:
        m = f.n - 1
        seen = (
            f"every other member saw the loss {f.seen_seconds:.3f} s after the revoke "
            f"({f.seen_cpu_seconds:.3f} s CPU, {f.seen_gc_seconds:.3f} s of it in the collector; "
            f"{f.seen_cpu_seconds / m * 1e6:.0f} us, {f.seen_events / m:.2f} events and "
            f"{f.seen_visits / m:.2f} watcher visits per survivor)"
        )
        again = (
            f"the round of {m} in {f.again_seconds:.3f} s ({f.again_cpu_seconds:.3f} s CPU, "
            f"{f.again_gc_seconds:.3f} s of it in the "
            f"collector, {f.again_gc_full} full collections; "
            f"{f.again_cpu_seconds / m * 1e6:.0f} us, {f.again_events / m:.2f} events, "
            f"{f.again_visits / m:.2f} visits and {f.again_writes / m:.2f} writes per member)"
        )
        lines.append(f"  N={f.n} --kill (in process): {seen}; {again}")
    return "\n".join(lines)
