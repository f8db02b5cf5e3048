"""Coordination primitives: lock throughput, handover latency and leader failover, as figures.

    python benchmarks/primitives.py                  # memory backend (real time)
    python benchmarks/primitives.py --serve http     # starts `aioelastic serve` for the run
    python benchmarks/primitives.py --serve etcd     # starts `aioelastic etcd` for the run
    python benchmarks/primitives.py --url etcd://127.0.0.1:2379   # a store already running
    python benchmarks/primitives.py --quick

Targets (issue #10): uncontended lock acquire+release >= 20,000/s over the memory store;
handover to a waiter on release <= 5 ms over http; leader failover <= TTL + 200 ms.
Not a test: it prints numbers for a person to read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio

from aioelastic.store import MemoryEngine, MemoryStore, Store, open_store
from aioelastic.sync import Election, LeaseConfig, Lock, store_lock


@contextlib.asynccontextmanager
async def client(url: str | None, engine: MemoryEngine | None) -> AsyncIterator[Store]:
    """A new client: of ``url``, or of the shared in-process ``engine``."""
    if url is None:
        assert engine is not None
        async with MemoryStore(engine) as store:
            yield store
    else:
        async with open_store(url) as store:
            yield store


async def uncontended(store: Store, n: int, config: LeaseConfig, shared: bool) -> float:
    """Acquire+release per second of one lock nobody else wants."""
    name = f"bench/{uuid.uuid4().hex}"
    if shared:
        async with config.lease(store) as lease:
            lock = Lock(store, name, lease=lease)
            start = time.perf_counter()
            for _ in range(n):
                async with lock:
                    pass
            return n / (time.perf_counter() - start)
    lock = Lock(store, name, config=config)
    start = time.perf_counter()
    for _ in range(n):
        async with lock:
            pass
    return n / (time.perf_counter() - start)


async def handover(a: Store, b: Store, rounds: int, config: LeaseConfig) -> list[float]:
    """Seconds from the holder's release() call to the waiter holding the lock."""
    name = f"bench/{uuid.uuid4().hex}"
    samples: list[float] = []
    async with config.lease(a) as lease_a, config.lease(b) as lease_b:
        for _ in range(rounds):
            holder = Lock(a, name, lease=lease_a)
            await holder.acquire()
            got = asyncio.get_running_loop().create_future()

            async def wait(got: asyncio.Future[float] = got) -> None:
                async with Lock(b, name, lease=lease_b):
                    got.set_result(time.perf_counter())

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.005)  # let the waiter queue up and start watching
                released = time.perf_counter()
                await holder.release()
                samples.append(await got - released)
    return samples


async def failover(
    url: str | None, engine: MemoryEngine | None, rounds: int, config: LeaseConfig
) -> tuple[list[float], list[float]]:
    """Leader failover: seconds from the leader's crash, and from its last lease renewal (the
    worst case: a crash just after a renewal), to the standby being elected.

    The crash: the leader's client goes silent (closed without revoking), so its lease runs
    out; the standby, already campaigning, wins when it does.
    """
    from_crash: list[float] = []
    from_renewal: list[float] = []
    loop = asyncio.get_running_loop()
    for _ in range(rounds):
        name = f"bench/{uuid.uuid4().hex}"
        async with client(url, engine) as standby_store, client(url, engine) as leader_store:
            leader = Election(leader_store, name, config=config)
            await leader.campaign("leader")
            await anyio.sleep(config.retry_period * 1.5)  # a keep-alive or two
            elected: asyncio.Future[float] = loop.create_future()

            async def stand(elected: asyncio.Future[float] = elected, name: str = name) -> None:
                async with Election(standby_store, name, config=config).leadership("standby"):
                    elected.set_result(loop.time())

            async with anyio.create_task_group() as tg:
                tg.start_soon(stand)
                await anyio.sleep(0.05)
                last_renewal = leader.lease.statistics().last_renewal
                crashed = loop.time()
                await leader_store.aclose()  # silent from now on: no revoke, no keep-alive
                at = await elected
            from_crash.append(at - crashed)
            from_renewal.append(at - last_renewal)
            await leader.lease.aclose(revoke=False)
    return from_crash, from_renewal


def ms(values: list[float]) -> str:
    qs = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return (
        f"median {statistics.median(values) * 1e3:7.3f} ms   p99 {qs[98] * 1e3:7.3f} ms   "
        f"max {max(values) * 1e3:7.3f} ms   (n={len(values)})"
    )


async def main(url: str | None, quick: bool) -> None:
    engine = None if url is not None else MemoryEngine()
    # over a network a store call is a round trip: fewer iterations
    n = (5_000 if quick else 50_000) if url is None else (300 if quick else 1_500)
    config = LeaseConfig(ttl=2.0, renew_deadline=1.5, retry_period=0.25)
    where = url or "memory (in-process, real time)"
    print(f"coordination primitives over {where}")
    async with client(url, engine) as a, client(url, engine) as b:
        for shared in (True, False):
            await uncontended(a, n // 10, config, shared)  # warm up
            runs = [await uncontended(a, n, config, shared) for _ in range(5)]
            how = "a shared lease (LeaseConfig.lease)" if shared else "a private lease each time"
            print(
                f"  uncontended lock acquire+release, {how:<36} best {max(runs):>8,.0f} /s"
                f"   median {statistics.median(runs):>8,.0f} /s"
            )
        samples = await handover(a, b, 50 if quick else 300, config)
        print(f"  handover to a waiting process on release          {ms(samples)}")
        async with store_lock(a, "bench/warm", config=config):
            pass
    rounds = 2 if quick else 5
    from_crash, from_renewal = await failover(url, engine, rounds, config)
    print(f"  leader failover, from the crash                   {ms(from_crash)}")
    print(
        f"  leader failover, from the last renewal (worst)    {ms(from_renewal)}"
        f"   target <= TTL + 200 ms = {(config.ttl + 0.2) * 1e3:.0f} ms"
    )


@contextlib.contextmanager
def served(kind: str) -> Iterator[str]:
    """Run ``aioelastic serve`` or ``aioelastic etcd`` in a child process; yield its store URL."""
    args = ["serve", "--port", "0"] if kind == "http" else ["etcd"]
    child = subprocess.Popen(
        [sys.executable, "-m", "aioelastic", *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if kind == "http" and "listening on " in line:
                yield line.split("listening on ")[1].split()[0]
                return
            if kind == "etcd" and line.startswith("store url: "):
                yield line.split("store url: ")[1].strip()
                return
        raise RuntimeError(f"aioelastic {args[0]} exited before saying where it listens")
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="a store URL (default: an in-process memory store)")
    where.add_argument("--serve", choices=["http", "etcd"], help="start a server for the run")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # a crashed leader's lease loss is expected here
    if args.serve:
        with served(args.serve) as url:
            asyncio.run(main(url, args.quick))
    else:
        asyncio.run(main(args.url, args.quick))
