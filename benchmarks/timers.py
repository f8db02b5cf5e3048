"""Watchdog-timer benchmark: reap lateness, memory per armed timer, acquire+release rate.

Run from the repository root: ``python benchmarks/timers.py`` (``--quick`` for a smaller run).
Prints:

- reap lateness (reaper call time minus deadline) for 1,000 concurrent timers in-process
  (``LocalTimerServer``) and across processes (4 worker processes over ``UnixTimerServer``;
  lateness measured against the wall-clock expiration the worker asked for);
- end-to-end SIGKILL lateness: a hung worker process, from its expiration to the moment the
  parent sees it dead (a few sequential trials);
- the same through the store transport on the memory backend (deadline to reaper, including
  the compare-and-delete claim);
- memory held by one server for 100,000 armed timers (tracemalloc);
- in-process acquire+release per second (client calls, and whole ``expires`` guards).

The event loop is asyncio's default; the ``aioelastic.timer`` log goes to a NullHandler (each
reap still creates its log record).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aioelastic.timer import (  # noqa: E402
    ExpiredTimer,
    LocalTimerServer,
    TimerRequest,
    UnixTimerServer,
    expires,
)

WORKER = """
import asyncio, sys, time
from aioelastic.timer import UnixTimerClient

async def main(path: str, index: int, count: int, base: float, window: float) -> None:
    rng = __import__("random").Random(index)
    async with UnixTimerClient(path) as client:
        for i in range(count):
            expiration = base + rng.random() * window
            await client.acquire(f"s{i}", expiration - time.time())
        print("armed", flush=True)
        await asyncio.sleep(base + window + 1.0 - time.time())  # stay alive until all fired

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                 float(sys.argv[5])))
"""

HANG = """
import asyncio, sys, time
from aioelastic.timer import UnixTimerClient

async def main(path: str) -> None:
    client = UnixTimerClient(path)
    await client.acquire("hang", 0.2)
    print(time.time() + 0.2, flush=True)  # about the expiration it asked for
    time.sleep(60)

asyncio.run(main(sys.argv[1]))
"""


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * 1000

    return (
        f"n={len(ordered)} p50={pct(50):.3f} ms p99={pct(99):.3f} ms "
        f"max={ordered[-1] * 1000:.3f} ms mean={statistics.fmean(ordered) * 1000:.3f} ms"
    )


async def lateness_in_process(count: int, window: float) -> list[float]:
    loop = asyncio.get_running_loop()
    late: list[float] = []

    def reaper(timer: ExpiredTimer) -> None:
        late.append(loop.time() - timer.deadline)

    rng = random.Random(1)
    async with LocalTimerServer(reaper) as server:
        client = server.client("bench")
        for i in range(count):
            await client.acquire(f"s{i}", 0.2 + rng.random() * window)
        await server.wait_reaped(count)
    return late


def torch_lateness(count: int, window: float, max_interval: float) -> list[float] | None:
    """Reap lateness of torch's ``LocalTimerServer`` (its watchdog thread, this process): the
    same ``count`` timers over ``window`` seconds as :func:`lateness_in_process`, each from its
    own worker id (torch reaps per worker), put on its request queue as ``LocalTimerClient``
    does. ``_reap_worker`` records instead of killing. None when torch is not installed.

    torch's watchdog wakes when a request arrives or every ``max_interval`` seconds (its
    default: 60): that is what its lateness is made of.
    """
    import importlib
    import multiprocessing
    import threading

    try:
        local_timer = importlib.import_module("torch.distributed.elastic.timer.local_timer")
        api = importlib.import_module("torch.distributed.elastic.timer.api")
    except ImportError:
        return None
    late: list[float] = []
    expirations: dict[int, float] = {}
    done = threading.Event()

    class Server(local_timer.LocalTimerServer):  # type: ignore[misc,name-defined]
        def _reap_worker(self, worker_id: int) -> bool:
            late.append(time.time() - expirations[worker_id])
            if len(late) == count:
                done.set()
            return True

    queue = multiprocessing.get_context("spawn").Queue()
    server = Server(queue, max_interval=max_interval)
    server.start()
    try:
        rng = random.Random(1)
        for i in range(count):
            expirations[i] = time.time() + 0.2 + rng.random() * window
            queue.put(api.TimerRequest(i, f"s{i}", expirations[i]))
        if not done.wait(window + 30):
            raise RuntimeError(f"torch reaped {len(late)} of {count} timers")
    finally:
        server.stop()
        queue.close()
        queue.join_thread()
    return late


async def lateness_through_memory_store(count: int, window: float) -> list[float]:
    """Reap lateness through the store transport (memory backend): includes the CAS claim."""
    from aioelastic.store import MemoryStore
    from aioelastic.timer import StoreTimerClient, StoreTimerServer

    loop = asyncio.get_running_loop()
    late: list[float] = []

    def reaper(timer: ExpiredTimer) -> None:
        late.append(loop.time() - timer.deadline)

    rng = random.Random(2)
    async with MemoryStore() as store, StoreTimerServer(store, reaper, prefix="b/") as server:
        client = StoreTimerClient(store, "bench", prefix="b/")
        for i in range(count):
            await client.acquire(f"s{i}", 0.5 + rng.random() * window)
        await server.wait_reaped(count)
    return late


async def lateness_across_processes(
    path: str, processes: int, per_process: int, window: float
) -> list[float]:
    late: list[float] = []

    def reaper(timer: ExpiredTimer) -> None:
        assert timer.expiration_time is not None
        late.append(time.time() - timer.expiration_time)

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    async with UnixTimerServer(path, reaper) as server:
        base = time.time() + 3.0  # time for the workers to start and arm everything
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                WORKER,
                path,
                str(i),
                str(per_process),
                str(base),
                str(window),
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            for i in range(processes)
        ]
        for proc in procs:
            assert proc.stdout is not None
            line = await proc.stdout.readline()
            assert line.strip() == b"armed", line
        if time.time() > base:
            print("  warning: workers armed their timers after the first deadline", flush=True)
        await asyncio.wait_for(server.wait_reaped(processes * per_process), window + 30)
        for proc in procs:
            await proc.wait()
    return late


async def kill_lateness(path: str, trials: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    late: list[float] = []
    async with UnixTimerServer(path):
        for _ in range(trials):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", HANG, path, stdout=asyncio.subprocess.PIPE, env=env
            )
            assert proc.stdout is not None
            expiration = float(await proc.stdout.readline())
            code = await asyncio.wait_for(proc.wait(), 30)
            late.append(time.time() - expiration)
            assert code == -9, code
    return late


async def memory_for_armed(count: int, wire: bool) -> float:
    async with LocalTimerServer(lambda t: None) as server:
        client = server.client("bench")
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        if wire:
            expiration = time.time() + 3600
            for i in range(count):
                server.submit(TimerRequest(10_000 + i % 64, f"scope-{i}", expiration, signal=9))
        else:
            for i in range(count):
                await client.acquire(f"scope-{i}", 3600)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert server.armed == count
    return (after - before) / 1e6


async def acquire_release_rate(count: int) -> tuple[float, float]:
    async with LocalTimerServer(lambda t: None) as server:
        client = server.client("bench")
        start = time.perf_counter()
        for _ in range(count):
            await client.acquire("s", 60)
            await client.release("s")
        calls = count / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(count):
            async with expires(after=60, scope="g", client=client):
                pass
        guards = count / (time.perf_counter() - start)
    return calls, guards


async def main(quick: bool) -> None:
    log = logging.getLogger("aioelastic.timer")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    loop_name = type(asyncio.get_running_loop()).__name__
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, loop {loop_name}")

    count = 1000
    window = 1.0
    late = await lateness_in_process(count, window)
    print(
        f"in-process reap lateness, {count} concurrent timers over {window}s: {percentiles(late)}"
    )

    late = await lateness_through_memory_store(count, window)
    print(
        f"store-transport reap lateness (memory store, claim by compare_and_delete), {count} "
        f"timers over {window}s: {percentiles(late)}"
    )

    directory = tempfile.mkdtemp(prefix="aetb-", dir="/tmp")
    try:
        path = os.path.join(directory, "t.sock")
        late = await lateness_across_processes(path, 4, count // 4, window)
        print(
            f"cross-process reap lateness (Unix socket), {count} concurrent timers from 4 "
            f"processes over {window}s: {percentiles(late)}"
        )
        trials = 3 if quick else 10
        late = await kill_lateness(path, trials)
        print(f"hung process SIGKILLed, expiration -> parent sees exit: {percentiles(late)}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    armed = 20_000 if quick else 100_000
    mb = await memory_for_armed(armed, wire=False)
    print(
        f"memory for {armed} armed in-process timers: {mb:.1f} MB ({mb * 1e6 / armed:.0f} B each)"
    )
    mb = await memory_for_armed(armed, wire=True)
    print(
        f"memory for {armed} armed wire timers (pid, signal, expiration): {mb:.1f} MB "
        f"({mb * 1e6 / armed:.0f} B each)"
    )

    calls, guards = await acquire_release_rate(20_000 if quick else 100_000)
    print(f"in-process acquire+release: {calls:,.0f}/s (client calls), {guards:,.0f}/s (guards)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller run")
    asyncio.run(main(parser.parse_args().quick))
