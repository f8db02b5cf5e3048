"""What the cyclic garbage collector sees of a rendezvous round of N in one process (memory
store, min = max = N, the virtual-time loop so that no lease expires on a loaded host).

With N participants alive in one process, each full collection traverses all of their objects,
and how many full collections a round triggers depends on how many objects it promotes into the
oldest generation: every object alive at a generation-1 collection, which with N joins in
lockstep is everything a join keeps across a loop turn. Printed per participant: tracked objects
of an idle handler, of a member waiting for its round, kept after the round (forced collections
around a round of N + 1); then, over a round of N left to the collector, the objects promoted
per join, by type (the young generations' census at the start of each generation-1
collection), and its collections by generation with their CPU time.

::

    python -m benchmarks.gc_census --n 10000 --top 25
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from aioelastic.store import MemoryEngine
from aioelastic.testing import run_virtual
from benchmarks.scale import make_handlers


@dataclass
class Census:
    """Per participant (``n``): tracked objects idle, waiting, kept; promoted per join."""

    n: int
    idle: float = 0.0
    waiting: float = 0.0
    kept: float = 0.0
    promoted: Counter[str] = field(default_factory=Counter)
    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


class _Meter:
    """gc.callbacks: the young generations' types at each generation-1 collection (promoted:
    what survives it moves to the oldest), and each collection's generation and CPU time."""

    def __init__(self, census: Census) -> None:
        self.census = census
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            if generation == 1:  # (types only: an object under construction may be young)
                for young in (0, 1):
                    self.census.promoted.update(
                        type(o).__qualname__ for o in gc.get_objects(generation=young)
                    )
            self._started = time.thread_time()
            return
        self.census.collections[generation] += 1
        self.census.seconds[generation] += time.thread_time() - self._started


async def measure(n: int) -> Census:
    """Two rounds of fresh handlers: one counted at rest (idle, all waiting, after), then one
    left to the collector alone (its collections and what they promote; no forced collection)."""
    census = Census(n)
    base = _tracked()
    handlers = make_handlers(MemoryEngine(), n + 1)  # the last one joins last: all others wait
    census.idle = (_tracked() - base) / (n + 1)
    before = _tracked()
    joins = [asyncio.ensure_future(h.next_rendezvous()) for h in handlers[:n]]
    await asyncio.sleep(1)  # (virtual time: every join registered and waits)
    census.waiting = (_tracked() - before) / n
    joins.append(asyncio.ensure_future(handlers[n].next_rendezvous()))
    await asyncio.gather(*joins)
    del joins
    census.kept = (_tracked() - before) / (n + 1)
    await asyncio.gather(*(h.aclose() for h in handlers))
    del handlers
    handlers = make_handlers(MemoryEngine(), n)
    meter = _Meter(census)
    gc.callbacks.append(meter)
    try:
        results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    finally:
        gc.callbacks.remove(meter)
    assert sorted(r.rank for r in results) == list(range(n))
    await asyncio.gather(*(h.aclose() for h in handlers))
    return census


def report(census: Census, top: int) -> str:
    n = census.n
    total = sum(census.promoted.values())
    lines = [
        f"N={n}: tracked objects per participant: idle handler {census.idle:.2f}, waiting member "
        f"{census.waiting:.2f}, kept after the round {census.kept:.2f}",
        "collections over the round: "
        + ", ".join(
            f"gen{g} {c} ({s * 1000:.0f} ms)"
            for g, (c, s) in enumerate(zip(census.collections, census.seconds, strict=True))
        ),
        f"promoted into the oldest generation: {total / n:.1f} per join; by type:",
    ]
    lines += [f"  {count / n:7.2f}  {name}" for name, count in census.promoted.most_common(top)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gc_census", description=__doc__)
    parser.add_argument("--n", type=int, default=10_000, help="participants (default 10,000)")
    parser.add_argument("--top", type=int, default=25, help="promoted types listed")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be >= 1")
    print(report(run_virtual(measure(args.n)), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
