"""Store operation throughput and watch fan-out latency, printed as figures.

    python benchmarks/store_ops.py            # memory backend
    python benchmarks/store_ops.py --quick    # fewer iterations

Not a test: it prints numbers for a person (and the closing notes) to read.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

import anyio

from aioelastic.store import EventType, MemoryStore, Store, Watch


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} ops/s"


async def sequential(store: Store, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    t = time.perf_counter()
    for i in range(n):
        await store.put(f"bench/{i % 1000}", b"value")
    out["put"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(n):
        await store.get(f"bench/{i % 1000}")
    out["get"] = n / (time.perf_counter() - t)
    kv = await store.get("bench/0")
    assert kv is not None
    rev = kv.mod_revision
    t = time.perf_counter()
    for _ in range(n):
        result = await store.compare_and_swap("bench/0", rev, b"v")
        rev = result.revision
    out["compare_and_swap"] = n / (time.perf_counter() - t)
    return out


async def concurrent(store: Store, tasks: int, per_task: int) -> float:
    async def worker(i: int) -> None:
        for j in range(per_task):
            await store.put(f"conc/{i}", str(j).encode())
            await store.get(f"conc/{i}")

    t = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(tasks):
            tg.start_soon(worker, i)
    return tasks * per_task * 2 / (time.perf_counter() - t)


async def fan_out(store: Store, watchers: int, rounds: int) -> list[float]:
    """Seconds from one put until every watcher on its prefix has the event."""
    results: list[float] = []
    watches = [store.watch("fan/") for _ in range(watchers)]
    for w in watches:
        await w.start()
    try:
        for r in range(rounds):
            seen = 0
            all_seen = asyncio.Event()

            async def consume(w: Watch, all_seen: asyncio.Event = all_seen) -> None:
                nonlocal seen
                await w.__anext__()
                seen += 1
                if seen == watchers:
                    all_seen.set()

            tasks = [asyncio.ensure_future(consume(w)) for w in watches]
            await asyncio.sleep(0.01)  # let every consumer block on its watch
            t = time.perf_counter()
            await store.put("fan/key", str(r).encode())
            await all_seen.wait()
            results.append(time.perf_counter() - t)
            await asyncio.gather(*tasks)
    finally:
        for w in watches:
            await w.aclose()
    return results


async def lease_expiry(store: Store, leases: int, freeze: bool) -> list[float]:
    """Lateness (s) of each lease's DELETE event after its deadline, in real time.

    With ``freeze``, the objects made during setup are moved out of the cyclic GC's reach
    (``gc.freeze()``, as long-running services do): a full collection over a few hundred
    thousand live objects pauses the loop for 10-40 ms, which is what the tail shows otherwise.
    """
    loop = asyncio.get_running_loop()
    deadlines: dict[str, float] = {}
    for i in range(leases):
        ttl = 1.0 + (i % 1000) / 1000  # deadlines spread over one second
        granted_at = loop.time()
        grant = await store.lease_grant(ttl)
        await store.put(f"lease/{i}", b"x", lease=grant.id)
        deadlines[f"lease/{i}"] = granted_at + ttl
    if freeze:
        gc.collect()
        gc.freeze()
    lateness: list[float] = []
    async with store.watch("lease/") as events:
        async for event in events:
            if event.type is EventType.DELETE:
                lateness.append(loop.time() - deadlines[event.kv.key])
                if len(lateness) == leases:
                    break
    gc.unfreeze()
    return lateness


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(quick: bool) -> None:
    n = 20_000 if quick else 200_000
    print(f"aioelastic store benchmarks (memory backend), n={n:,}")
    async with MemoryStore() as store:
        seq = await sequential(store, n)
        for op, ops in seq.items():
            print(f"  sequential {op:<18}{ops:>12,.0f} ops/s")
        conc = await concurrent(store, 100, n // 200)
        print(f"  100 concurrent tasks (put+get){conc:>10,.0f} ops/s")
        fan = await fan_out(store, 1000, 5 if quick else 20)
        print(
            f"  watch fan-out, 1,000 watchers: median {statistics.median(fan) * 1e3:.2f} ms, "
            f"max {max(fan) * 1e3:.2f} ms (put -> all notified)"
        )
    for freeze in (False, True):
        async with MemoryStore() as store:
            late = await lease_expiry(store, 2_000 if quick else 10_000, freeze)
        label = "gc.freeze() after setup" if freeze else "default gc"
        print(
            f"  lease expiry, {len(late):,} leases ({label}): lateness "
            f"p50 {pct(late, 0.5) * 1e3:.2f} ms, p99 {pct(late, 0.99) * 1e3:.2f} ms, "
            f"max {max(late) * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    asyncio.run(main(parser.parse_args().quick))
