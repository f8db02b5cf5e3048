"""Transactions at work over the HTTP store: many tasks incrementing one key, and torch's
``compare_set``, before (a read and a compare-and-swap loop) and after (transactions).

Runs ``python -m aioelastic serve`` in a subprocess on 127.0.0.1 and prints, for ``--tasks``
tasks of ``--clients`` clients incrementing one key ``--increments`` times in all:

- ``cas loop``: what ``add`` did without an increment of its own (etcd; any backend): read, then
  compare-and-swap, re-read on conflict; conflicts = failed compare-and-swaps;
- ``cas + lock``: the same with a client's adds to one key queued behind a lock, as the etcd
  store's ``add`` did before;
- ``txn add``: ``add`` on transactions now (``aioelastic.store._add.CounterAdder``: one
  transaction per attempt that reads the key back on conflict, concurrent adds from one client
  combined into one transaction); conflicts = transactions whose compare failed;
- ``stm``: the same increment as ``store.stm`` functions (no combining); conflicts = attempts
  beyond the first;
- ``server add``: the HTTP server's own atomic add (what ``http://`` stores use), for reference;

and the latency of ``compare_set`` (torch's semantics) before and after, for calls that swap and
calls whose value does not match. Every figure is the
median of ``--repeat`` runs, with the range. Usage: ``python benchmarks/txn.py [--tasks 50]
[--clients 1] [--increments 1000] [--repeat 5] [--calls 300] [--backend http|etcd]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aioelastic.store import StmTxn, Store, open_store  # noqa: E402
from aioelastic.store._add import CounterAdder  # noqa: E402
from benchmarks import http_ops  # noqa: E402

#: an increment of ``key``; answers how many conflicts it met
Increment = Callable[[Store, str], Awaitable[int]]


async def cas_loop_add(store: Store, key: str) -> int:
    """The former ``Store._add``: read, then compare-and-swap until it applies."""
    conflicts = 0
    current = await store.get(key)
    while True:
        base = 0 if current is None else int(current.value)
        expected = 0 if current is None else current.mod_revision
        result = await store.compare_and_swap(key, expected, str(base + 1).encode())
        if result.succeeded:
            return conflicts
        conflicts += 1
        current = result.kv


def locked(increment: Increment) -> Increment:
    """``increment`` with the adds of one client to one key queued behind a lock: what the
    etcd store's ``add`` did before (no conflicts between a client's own tasks)."""
    locks: dict[tuple[int, str], asyncio.Lock] = {}

    async def add(store: Store, key: str) -> int:
        async with locks.setdefault((id(store), key), asyncio.Lock()):
            return await increment(store, key)

    return add


async def stm_add(store: Store, key: str) -> int:
    attempts = 0

    async def increment(tx: StmTxn) -> None:
        nonlocal attempts
        attempts += 1
        tx.put(key, str(int(await tx.get(key) or b"0") + 1).encode())

    await store.stm(increment, max_attempts=10_000)
    return attempts - 1


async def server_add(store: Store, key: str) -> int:
    await store.add(key, 1)
    return 0


def txn_adder(adders: dict[int, CounterAdder]) -> Increment:
    async def add(store: Store, key: str) -> int:
        adder = adders.setdefault(id(store), CounterAdder(store))
        await adder.add(key, 1)
        return 0  # counted by the adder

    return add


async def increments(
    stores: list[Store], increment: Increment, tasks: int, total: int, key: str
) -> tuple[float, int]:
    """``total`` increments by ``tasks`` tasks spread over ``stores``: (seconds, conflicts)."""
    conflicts = 0

    async def worker(store: Store, count: int) -> None:
        nonlocal conflicts
        for _ in range(count):
            seen = await increment(store, key)  # (not `conflicts += await ...`: that loses
            conflicts += seen  # the updates made while it waits, the very bug measured here)

    shares = [total // tasks + (1 if i < total % tasks else 0) for i in range(tasks)]
    started = time.perf_counter()
    await asyncio.gather(*(worker(stores[i % len(stores)], n) for i, n in enumerate(shares)))
    seconds = time.perf_counter() - started
    kv = await stores[0].get(key)
    if kv is None or int(kv.value) != total:
        raise AssertionError(f"lost increments: {kv} after {total}")
    return seconds, conflicts


async def old_compare_set(store: Store, key: str, expected: bytes, desired: bytes) -> bytes:
    """The former ``TorchStore.compare_set``: read, then compare-and-swap (retried)."""
    while True:
        kv = await store.get(key)
        if kv is None and expected:
            return expected
        if kv is not None and kv.value != expected:
            return kv.value
        result = await store.compare_and_swap(key, 0 if kv is None else kv.mod_revision, desired)
        if result.succeeded:
            return desired


async def compare_set_latency(
    store: Store, fn: Callable[[Store, str, bytes, bytes], Awaitable[bytes]], calls: int, key: str
) -> tuple[list[float], list[float]]:
    """Seconds per call, alternately a swap that applies and one whose value does not match:
    (those that swapped, those that did not)."""
    await store.put(key, b"0")
    swapped: list[float] = []
    mismatched: list[float] = []
    for i in range(calls):
        expected = str(i // 2).encode() if i % 2 == 0 else b"stale"
        desired = str(i // 2 + 1).encode()
        started = time.perf_counter()
        await fn(store, key, expected, desired)
        (swapped if i % 2 == 0 else mismatched).append(time.perf_counter() - started)
    return swapped, mismatched


def _range(values: list[float], fmt: str) -> str:
    return (
        f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-"
        + format(max(values), fmt)
        + ")"
    )


@contextlib.asynccontextmanager
async def clients(url: str, n: int) -> AsyncIterator[list[Store]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(await open_store(url)) for _ in range(n)]


async def main(url: str, args: argparse.Namespace) -> None:
    from aioelastic.torchrun import compare_set

    print(
        f"{args.increments} increments of one key by {args.tasks} tasks on {args.clients} "
        f"client(s), {args.backend}; median (min-max) of {args.repeat} runs"
    )
    print(f"{'':12} {'increments/s':>24} {'conflicts':>22} {'transactions':>22}")
    async with clients(url, args.clients) as stores:
        base = stores[0].namespace(f"bench/{time.time_ns()}/")
        stores = [s.namespace(base.prefix) for s in stores]  # type: ignore[attr-defined]
        modes: list[tuple[str, Increment | None]] = [
            ("cas loop", cas_loop_add),
            ("cas + lock", locked(cas_loop_add)),
            ("txn add", None),
            ("stm", stm_add),
        ]
        if args.backend == "http":
            modes.append(("server add", server_add))
        for name, increment in modes:
            rates, conflicts, txns = [], [], []
            for run in range(args.repeat):
                adders: dict[int, CounterAdder] = {}
                fn = increment if increment is not None else txn_adder(adders)
                seconds, seen = await increments(
                    stores, fn, args.tasks, args.increments, f"{name}/{run}"
                )
                rates.append(args.increments / seconds)
                if increment is None:
                    seen = sum(a.conflicts for a in adders.values())
                    txns.append(float(sum(a.transactions for a in adders.values())))
                conflicts.append(float(seen))
            print(
                f"{name:12} {_range(rates, '.0f'):>24} {_range(conflicts, '.0f'):>22} "
                f"{_range(txns, '.0f') if txns else '':>22}"
            )
        print(f"\ncompare_set, {args.calls} sequential calls, median ms per call (min-max):")
        print(f"{'':12} {'value matched (swaps)':>28} {'value did not match':>28}")
        setters: list[tuple[str, Callable[[Store, str, bytes, bytes], Awaitable[bytes]]]] = [
            ("read + cas", old_compare_set),
            ("one txn", compare_set),
        ]
        for name, setter in setters:
            swaps, misses = [], []
            for run in range(args.repeat):
                key = f"cs/{name}/{run}"
                swapped, mismatched = await compare_set_latency(stores[0], setter, args.calls, key)
                swaps.append(statistics.median(swapped) * 1e3)
                misses.append(statistics.median(mismatched) * 1e3)
            print(f"{name:12} {_range(swaps, '.3f'):>28} {_range(misses, '.3f'):>28}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--increments", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--backend", choices=["http", "etcd"], default="http")
    args = parser.parse_args()
    if args.backend == "etcd":
        from aioelastic.etcd_server import EtcdServer

        async def on_etcd() -> None:
            async with EtcdServer() as server:
                await main(server.url, args)

        asyncio.run(on_etcd())
        return
    proc, url = http_ops.start_server()
    try:
        asyncio.run(main(url, args))
    finally:
        http_ops.stop_server(proc)


if __name__ == "__main__":
    cli()
