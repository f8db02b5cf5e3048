"""The memory engine's cost per rejoin write as the key space grows: a new round's record put
and the old one deleted, for each of N keys already there (the rendezvous' per-join writes).

    PYTHONPATH=. nice -n 5 python -m benchmarks.memory_keys [--sizes 1000,10000,50000]

It should not grow with N (an ordered list that every insert and delete shifts made it O(N)).
Thread CPU time; median and range over ``--repeat`` passes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from aioelastic.store.memory import MemoryEngine


async def _per_write(n: int) -> float:
    engine = MemoryEngine(history_limit=10**9)
    for i in range(n):
        engine.put(f"aioelastic/rdzv/run/n/0/{i:012x}", b"v")
    start = time.thread_time()
    for i in range(n):
        engine.put(f"aioelastic/rdzv/run/n/1/{i:012x}", b"v")
        engine.delete(f"aioelastic/rdzv/run/n/0/{i:012x}")
    return (time.thread_time() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for n in (int(size) for size in args.sizes.split(",")):
        runs = [asyncio.run(_per_write(n)) for _ in range(args.repeat)]
        print(
            f"N={n:>6}: {statistics.median(runs) * 1e6:5.1f} us per put + delete "
            f"({min(runs) * 1e6:.1f}-{max(runs) * 1e6:.1f})"
        )


if __name__ == "__main__":
    main()
