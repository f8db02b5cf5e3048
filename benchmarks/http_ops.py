"""HTTP store throughput and watch fan-out, with torch's TCPStore side by side when installed.

Runs ``python -m aioelastic serve`` in a subprocess on 127.0.0.1 (so server and clients use
separate cores) and prints:

- one client, sequential: put/s and get/s;
- 64 concurrent clients (one HttpStore each): aggregate ops/s (half puts, half gets);
- one put seen by 1,000 watchers: latency until the last watcher has it (median and max);
- the same operations on torch.distributed.TCPStore (C++), and the ratios.

Usage: ``python benchmarks/http_ops.py [--ops N] [--watchers N] [--data-dir] [--loop L]``.
Both the server and the clients use uvloop when it is installed, unless ``--loop asyncio``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aioelastic.store import Store, Watch, open_store  # noqa: E402


def start_server(*args: str) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "aioelastic", "serve", "--port", "0", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (\S+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"server did not start: {line}")
    return proc, match.group(1)


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)


def run(coro: Any, loop: str) -> Any:
    factory = None
    if loop == "uvloop":
        factory = importlib.import_module("uvloop").new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


class CpuMeter:
    """CPU seconds used by the server process and by this process over a span of work: a figure
    that, unlike ops/s, does not depend on what else the machine is running."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.server = 0.0
        self.client = 0.0

    def _now(self) -> tuple[float, float]:
        fields = Path(f"/proc/{self.server_pid}/stat").read_text().rpartition(")")[2].split()
        server = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return server, usage.ru_utime + usage.ru_stime

    def __enter__(self) -> CpuMeter:
        self._start = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._now()
        self.server = end[0] - self._start[0]
        self.client = end[1] - self._start[1]

    def per_op(self, ops: int) -> str:
        return (
            f"CPU/op: server {self.server / ops * 1e6:.0f} us, "
            f"client {self.client / ops * 1e6:.0f} us"
        )


async def sequential(url: str, ops: int, pid: int) -> list[tuple[str, float, str]]:
    rows = []
    async with open_store(url) as store:
        value = b"x" * 64
        for i in range(200):  # warm up the connection and the server
            await store.put(f"warm/{i}", value)
        with CpuMeter(pid) as cpu:
            start = time.perf_counter()
            for i in range(ops):
                await store.put(f"seq/{i % 1000}", value)
            elapsed = time.perf_counter() - start
        rows.append(("put", ops / elapsed, cpu.per_op(ops)))
        with CpuMeter(pid) as cpu:
            start = time.perf_counter()
            for i in range(ops):
                await store.get(f"seq/{i % 1000}")
            elapsed = time.perf_counter() - start
        rows.append(("get", ops / elapsed, cpu.per_op(ops)))
    return rows


async def concurrent(url: str, clients: int, ops_each: int, pid: int) -> tuple[float, str]:
    stores = [await open_store(url) for _ in range(clients)]
    try:

        async def work(n: int, store: Store) -> None:
            for i in range(ops_each):
                if i % 2:
                    await store.get(f"c/{n}")
                else:
                    await store.put(f"c/{n}", b"v" * 64)

        await asyncio.gather(*(store.put(f"c/{n}", b"") for n, store in enumerate(stores)))
        with CpuMeter(pid) as cpu:
            start = time.perf_counter()
            await asyncio.gather(*(work(n, s) for n, s in enumerate(stores)))
            elapsed = time.perf_counter() - start
        return clients * ops_each / elapsed, cpu.per_op(clients * ops_each)
    finally:
        for store in stores:
            await store.aclose()


async def fan_out(url: str, watchers: int, rounds: int, pid: int) -> tuple[list[float], str]:
    async with open_store(url) as writer, open_store(url, progress_interval=30) as reader:
        watches: list[Watch] = [reader.watch("fan/") for _ in range(watchers)]
        for i in range(0, watchers, 100):
            await asyncio.gather(*(w.start() for w in watches[i : i + 100]))
        latencies = []
        with CpuMeter(pid) as cpu:
            for r in range(rounds):
                latencies.append(await _one_round(writer, watches, r))
        for watch in watches:
            await watch.aclose()
    return latencies, cpu.per_op(watchers * rounds).replace("CPU/op", "CPU/delivery")


async def _one_round(writer: Store, watches: list[Watch], r: int) -> float:
    """Seconds from sending one put until the last of ``watches`` has received it."""
    done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    remaining = len(watches)

    async def one(watch: Watch) -> None:
        nonlocal remaining
        await watch.__anext__()
        remaining -= 1
        if remaining == 0:
            done.set_result(time.perf_counter())

    tasks = [asyncio.ensure_future(one(w)) for w in watches]
    await asyncio.sleep(0.2)  # every watcher waiting
    start = time.perf_counter()
    await writer.put("fan/key", str(r).encode())
    end = await asyncio.wait_for(done, 30)
    await asyncio.gather(*tasks)
    return end - start


def tcpstore_server() -> Any | None:
    """A torch TCPStore server (C++, a thread of this process) on 127.0.0.1; None without torch.
    Its port is ``.port``; it stops when the object is garbage."""
    try:  # imported by name: torch is optional, and typed only where it is installed
        distributed: Any = importlib.import_module("torch.distributed")
    except ImportError:
        return None
    return distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def tcpstore_sequential(port: int, ops: int) -> dict[str, float]:
    """One TCPStore client, sequential: {"put": set/s, "get": get/s}."""
    distributed: Any = importlib.import_module("torch.distributed")
    client = distributed.TCPStore("127.0.0.1", port, is_master=False)
    value = b"x" * 64
    for i in range(200):
        client.set(f"warm/{i}", value)
    start = time.perf_counter()
    for i in range(ops):
        client.set(f"seq/{i % 1000}", value)
    # set() does not wait for the server's reply; a get behind the sets (one connection, in
    # order) ends the clock when the server has applied them all
    client.get(f"seq/{(ops - 1) % 1000}")
    puts = ops / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(ops):
        client.get(f"seq/{i % 1000}")
    gets = ops / (time.perf_counter() - start)
    return {"put": puts, "get": gets}


def tcpstore_concurrent(port: int, clients: int, ops_each: int) -> float:
    """``clients`` TCPStore clients, one thread each, half set half get: aggregate ops/s."""
    distributed: Any = importlib.import_module("torch.distributed")
    value = b"x" * 64
    stores = [distributed.TCPStore("127.0.0.1", port, is_master=False) for _ in range(clients)]

    def work(n: int, store: Any) -> None:
        for i in range(ops_each):
            if i % 2:
                store.get(f"c/{n}")
            else:
                store.set(f"c/{n}", value)

    for n, store in enumerate(stores):
        store.set(f"c/{n}", b"")
    threads = [threading.Thread(target=work, args=(n, s)) for n, s in enumerate(stores)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return clients * ops_each / (time.perf_counter() - start)


def torch_rows(ops: int, clients: int, ops_each: int) -> dict[str, float] | None:
    server = tcpstore_server()
    if server is None:
        return None
    try:
        rows = tcpstore_sequential(server.port, ops)
        rows["concurrent"] = tcpstore_concurrent(server.port, clients, ops_each)
        return rows
    finally:
        del server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000, help="sequential ops per kind")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--ops-each", type=int, default=200, help="ops per concurrent client")
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5, help="fan-out rounds")
    parser.add_argument(
        "--data-dir", action="store_true", help="also measure with --data-dir (fsync always)"
    )
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    args = parser.parse_args()
    loop = args.loop
    if loop == "auto":
        try:
            importlib.import_module("uvloop")
            loop = "uvloop"
        except ImportError:
            loop = "asyncio"

    configs: list[tuple[str, tuple[str, ...]]] = [("in memory", ("--loop", loop))]
    tmp = None
    if args.data_dir:
        tmp = tempfile.TemporaryDirectory()
        configs.append(("data dir, fsync always", ("--loop", loop, "--data-dir", tmp.name)))
    print(
        f"aioelastic HTTP store on 127.0.0.1 ({os.cpu_count()} CPUs), "
        f"Python {sys.version.split()[0]}, {loop} event loop (server and clients)"
    )
    ours: dict[str, float] = {}
    for label, extra in configs:
        proc, url = start_server(*extra)
        try:
            rows = run(sequential(url, args.ops, proc.pid), loop)
            agg, agg_cpu = run(concurrent(url, args.clients, args.ops_each, proc.pid), loop)
            print(f"[{label}]")
            for name, ops_s, cpu in rows:
                print(f"  1 client sequential {name}        {ops_s:>10,.0f} ops/s   {cpu}")
            print(
                f"  {args.clients} clients concurrent (½ put) {agg:>10,.0f} ops/s   {agg_cpu} "
                "(aggregate)"
            )
            puts, gets = rows[0][1], rows[1][1]
            if not ours:
                ours = {"put": puts, "get": gets, "concurrent": agg}
                lat, fan_cpu = run(fan_out(url, args.watchers, args.rounds, proc.pid), loop)
                print(
                    f"  1 put -> {args.watchers} watchers         median "
                    f"{statistics.median(lat) * 1000:.1f} ms, max {max(lat) * 1000:.1f} ms "
                    f"(last watcher has it)   {fan_cpu}"
                )
        finally:
            stop_server(proc)
    if tmp is not None:
        tmp.cleanup()
    theirs = torch_rows(args.ops, args.clients, args.ops_each)
    if theirs is None:
        print("torch is not installed: no TCPStore comparison")
        return
    version = importlib.import_module("torch").__version__
    print(f"[torch {version} TCPStore (C++ server thread, same process)]")
    for name, label in (("put", "set"), ("get", "get"), ("concurrent", "concurrent")):
        print(
            f"  {label:<11} {theirs[name]:>10,.0f} ops/s   aioelastic/TCPStore = "
            f"{ours[name] / theirs[name]:.2f}"
        )


if __name__ == "__main__":
    main()
