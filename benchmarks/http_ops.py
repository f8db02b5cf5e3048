"""HTTP store throughput and watch fan-out, with torch's TCPStore side by side when installed.

Runs ``python -m aioelastic serve`` in a subprocess on 127.0.0.1 (so server and clients use
separate cores) and prints:

- one client, sequential: put/s and get/s;
- one client with ``--in-flight`` gets in flight at once (pipelined on its session): get/s;
- 64 concurrent clients (one HttpStore each): aggregate ops/s (half puts, half gets), with all
  clients in this one process (bound by one core of client CPU), and with the clients spread
  over ``--procs`` processes (server-bound: on a 2-core machine the server and the clients then
  share both cores);
- one put seen by 1,000 watchers: latency until the last watcher has it (median and max), the
  watchers on one session, then spread over ``--fan-sessions`` sessions (``--only fanout``
  runs just these rows; ``benchmarks/fanout.py`` compares two checkouts' fan-out in one run);
- the same operations on torch.distributed.TCPStore (C++), and the ratios.

Every throughput figure is the median of ``--repeat`` runs against the same server (the runs
are listed after it): the machine may be shared, so compare medians from one session. The CPU
each side spent per operation is printed too: unlike ops/s it barely depends on what else runs.

Usage: ``python benchmarks/http_ops.py [--ops N] [--repeat N] [--procs N] [--watchers N]
[--fan-sessions N] [--only fanout] [--data-dir] [--loop L] [--no-torch]``. Both the server and
the clients use uvloop when it is installed, unless ``--loop asyncio``.
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


async def pipelined(url: str, ops: int, depth: int, pid: int) -> tuple[float, str]:
    """One client, ``depth`` gets in flight at once (``depth`` tasks on one store)."""
    async with open_store(url, max_connections=0) as store:
        await store.put("pipe/k", b"x" * 64)

        async def worker() -> None:
            for _ in range(ops // depth):
                await store.get("pipe/k")

        await asyncio.gather(*(store.get("pipe/k") for _ in range(200)))  # warm up
        with CpuMeter(pid) as cpu:
            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(depth)))
            elapsed = time.perf_counter() - start
        done = ops // depth * depth
        return done / elapsed, cpu.per_op(done)


async def _work(n: int, store: Store, ops: int) -> None:
    """One client of the concurrent rows: ``ops`` operations on its key, half puts."""
    for i in range(ops):
        if i % 2:
            await store.get(f"c/{n}")
        else:
            await store.put(f"c/{n}", b"v" * 64)


async def concurrent(url: str, clients: int, ops_each: int, pid: int) -> tuple[float, str]:
    stores = [await open_store(url) for _ in range(clients)]
    try:
        await asyncio.gather(*(store.put(f"c/{n}", b"") for n, store in enumerate(stores)))
        with CpuMeter(pid) as cpu:
            start = time.perf_counter()
            await asyncio.gather(*(_work(n, s, ops_each) for n, s in enumerate(stores)))
            elapsed = time.perf_counter() - start
        return clients * ops_each / elapsed, cpu.per_op(clients * ops_each)
    finally:
        for store in stores:
            await store.aclose()


async def _child(url: str, first: int, clients: int, ops_each: int) -> None:
    """One client process of the multi-process row: ready, wait for go, work, report."""
    stores = [await open_store(url) for _ in range(clients)]
    try:
        await asyncio.gather(*(s.put(f"c/{first + n}", b"") for n, s in enumerate(stores)))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.gather(*(_work(first + n, s, ops_each) for n, s in enumerate(stores)))
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
        print(f"done {cpu}", flush=True)
    finally:
        for store in stores:
            await store.aclose()


def concurrent_procs(
    url: str, clients: int, ops_each: int, procs: int, pid: int, loop: str
) -> tuple[float, str]:
    """The concurrent row with the clients spread over ``procs`` processes."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    children = []
    share, extra = divmod(clients, procs)
    first = 0
    for p in range(procs):
        count = share + (1 if p < extra else 0)
        children.append(
            subprocess.Popen(
                [
                    *(sys.executable, __file__, "--loop", loop, "--ops-each", str(ops_each)),
                    *("--child", url, str(first), str(count)),
                ],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        first += count
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit("a client process did not start")
        with CpuMeter(pid) as cpu:
            start = time.perf_counter()
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            client_cpu = 0.0
            for child in children:
                assert child.stdout is not None
                client_cpu += float(child.stdout.readline().split()[1])
            elapsed = time.perf_counter() - start
        cpu.client = client_cpu
        return clients * ops_each / elapsed, cpu.per_op(clients * ops_each)
    finally:
        for child in children:
            child.wait(timeout=60)


async def fan_out(
    url: str, watchers: int, rounds: int, pid: int, sessions: int = 1
) -> tuple[list[float], str]:
    """``watchers`` watches of one prefix, spread over ``sessions`` reader stores (sessions)."""
    readers = [await open_store(url, progress_interval=30) for _ in range(sessions)]
    try:
        async with open_store(url) as writer:
            watches: list[Watch] = [readers[i % sessions].watch("fan/") for i in range(watchers)]
            for i in range(0, watchers, 100):
                await asyncio.gather(*(w.start() for w in watches[i : i + 100]))
            latencies = []
            window = 0.0
            with CpuMeter(pid) as cpu:
                for r in range(rounds):
                    seconds, spent = await _one_round(writer, watches, r)
                    latencies.append(seconds)
                    window += spent
            for watch in watches:
                await watch.aclose()
    finally:
        for reader in readers:
            await reader.aclose()
    deliveries = watchers * rounds
    return latencies, (
        f"{cpu.per_op(deliveries).replace('CPU/op', 'CPU/delivery')} (the rounds: their "
        f"tasks' start and end included); client {window / deliveries * 1e6:.1f} us from the "
        "put until the last watcher has it"
    )


def fan_out_rows(url: str, args: argparse.Namespace, pid: int, loop: str) -> None:
    """The fan-out rows: the watchers on one session, then spread over ``--fan-sessions``."""
    layouts = [1] + ([args.fan_sessions] if args.fan_sessions > 1 else [])
    for sessions in layouts:
        lat, fan_cpu = run(fan_out(url, args.watchers, args.rounds, pid, sessions), loop)
        where = "1 session" if sessions == 1 else f"{sessions} sessions"
        print(
            f"  1 put -> {args.watchers} watchers ({where}){'':<{max(0, 12 - len(where))}} "
            f"median {statistics.median(lat) * 1000:.1f} ms, max {max(lat) * 1000:.1f} ms "
            f"(last watcher has it; runs: {', '.join(f'{x * 1000:.1f}' for x in lat)})   "
            f"{fan_cpu}"
        )


async def _one_round(writer: Store, watches: list[Watch], r: int) -> tuple[float, float]:
    """(seconds, this thread's CPU seconds) from sending one put until the last of
    ``watches`` has received it."""
    done: asyncio.Future[tuple[float, float]] = asyncio.get_running_loop().create_future()
    remaining = len(watches)

    async def one(watch: Watch) -> None:
        nonlocal remaining
        await watch.__anext__()
        remaining -= 1
        if remaining == 0:
            done.set_result((time.perf_counter(), time.thread_time()))

    tasks = [asyncio.ensure_future(one(w)) for w in watches]
    await asyncio.sleep(0.2)  # every watcher waiting
    start, cpu = time.perf_counter(), time.thread_time()
    await writer.put("fan/key", str(r).encode())
    end, end_cpu = await asyncio.wait_for(done, 30)
    await asyncio.gather(*tasks)
    return end - start, end_cpu - cpu


def tcpstore_server() -> Any | None:
    """A torch TCPStore server (C++, a thread of this process) on 127.0.0.1; None without torch.
    Its port is ``.port``; it stops when the object is garbage."""
    try:  # imported by name: torch is optional, and typed only where it is installed
        distributed: Any = importlib.import_module("torch.distributed")
    except ImportError:
        return None
    return distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tcpstore_sequential(port: int, ops: int) -> dict[str, float]:
    """One TCPStore client, sequential: {"put": set/s, "get": get/s, "get_cpu": the process's
    CPU per get (its server thread and the client together)}."""
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
    start, cpu = time.perf_counter(), _process_cpu()
    for i in range(ops):
        client.get(f"seq/{i % 1000}")
    gets = ops / (time.perf_counter() - start)
    return {"put": puts, "get": gets, "get_cpu": (_process_cpu() - cpu) / ops}


def tcpstore_concurrent(
    port: int, clients: int, ops_each: int, cpu: list[float] | None = None
) -> float:
    """``clients`` TCPStore clients, one thread each, half set half get: aggregate ops/s (and
    appended to ``cpu``: the process's CPU per operation, its server thread and the clients
    together)."""
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
    start, used = time.perf_counter(), _process_cpu()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ops = clients * ops_each
    elapsed = time.perf_counter() - start
    if cpu is not None:
        cpu.append((_process_cpu() - used) / ops)
    return ops / elapsed


def torch_rows(ops: int, clients: int, ops_each: int) -> dict[str, float] | None:
    server = tcpstore_server()
    if server is None:
        return None
    try:
        rows = tcpstore_sequential(server.port, ops)
        cpu: list[float] = []
        rows["concurrent"] = tcpstore_concurrent(server.port, clients, ops_each, cpu)
        rows["concurrent_cpu"] = cpu[0]
        return rows
    finally:
        del server


def _median(runs: list[tuple[float, str]]) -> tuple[float, str, str]:
    """(median ops/s, the CPU/op text of the median run, all runs) of repeated measurements."""
    ordered = sorted(runs, key=lambda run: run[0])
    middle = ordered[len(ordered) // 2]
    spread = ", ".join(f"{ops:,.0f}" for ops, _ in runs)
    return middle[0], middle[1], spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000, help="sequential ops per kind")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--ops-each", type=int, default=200, help="ops per concurrent client")
    parser.add_argument(
        "--procs", type=int, default=2, help="client processes of the multi-process row (0: none)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median shown)")
    parser.add_argument("--in-flight", type=int, default=64, help="gets in flight, one client")
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5, help="fan-out rounds")
    parser.add_argument(
        "--fan-sessions",
        type=int,
        default=10,
        help="a second fan-out row with the watchers spread over this many sessions (1: none)",
    )
    parser.add_argument(
        "--only", choices=("fanout",), help="run only these rows (fanout: the fan-out rows)"
    )
    parser.add_argument(
        "--data-dir", action="store_true", help="also measure with --data-dir (fsync always)"
    )
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--no-torch", action="store_true", help="skip the TCPStore comparison")
    parser.add_argument(
        "--child", nargs=3, metavar=("URL", "FIRST", "CLIENTS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    loop = args.loop
    if loop == "auto":
        try:
            importlib.import_module("uvloop")
            loop = "uvloop"
        except ImportError:
            loop = "asyncio"
    if args.child:
        url, first, count = args.child
        run(_child(url, int(first), int(count), args.ops_each), loop)
        return

    configs: list[tuple[str, tuple[str, ...]]] = [("in memory", ("--loop", loop))]
    tmp = None
    if args.data_dir:
        tmp = tempfile.TemporaryDirectory()
        configs.append(("data dir, fsync always", ("--loop", loop, "--data-dir", tmp.name)))
    print(
        f"aioelastic HTTP store on 127.0.0.1 ({os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}), Python {sys.version.split()[0]}, {loop} event loop (server "
        f"and clients), median of {args.repeat} runs"
    )
    if args.only == "fanout":
        proc, url = start_server("--loop", loop)
        try:
            print("[in memory]")
            fan_out_rows(url, args, proc.pid, loop)
        finally:
            stop_server(proc)
        return
    ours: dict[str, float] = {}
    for label, extra in configs:
        proc, url = start_server(*extra)
        try:
            puts: list[tuple[float, str]] = []
            gets: list[tuple[float, str]] = []
            one: list[tuple[float, str]] = []
            many: list[tuple[float, str]] = []
            piped: list[tuple[float, str]] = []
            for _ in range(args.repeat):
                (_, put_s, put_cpu), (_, get_s, get_cpu) = run(
                    sequential(url, args.ops, proc.pid), loop
                )
                puts.append((put_s, put_cpu))
                gets.append((get_s, get_cpu))
                piped.append(run(pipelined(url, args.ops, args.in_flight, proc.pid), loop))
                one.append(run(concurrent(url, args.clients, args.ops_each, proc.pid), loop))
                if args.procs > 0:
                    many.append(
                        concurrent_procs(
                            url, args.clients, args.ops_each, args.procs, proc.pid, loop
                        )
                    )
            print(f"[{label}]")
            rows = [
                ("1 client sequential put", puts),
                ("1 client sequential get", gets),
                (f"1 client, {args.in_flight} gets in flight", piped),
                (f"{args.clients} clients, 1 process (½ put)", one),
            ]
            if many:
                rows.append((f"{args.clients} clients, {args.procs} processes", many))
            figures = {}
            for name, runs in rows:
                ops_s, cpu, spread = _median(runs)
                figures[name] = ops_s
                print(f"  {name:<32} {ops_s:>8,.0f} ops/s   {cpu}   (runs: {spread})")
            if not ours:
                ours = {
                    "put": _median(puts)[0],
                    "get": _median(gets)[0],
                    "pipelined": _median(piped)[0],
                    "concurrent": max(_median(one)[0], _median(many)[0] if many else 0.0),
                }
                fan_out_rows(url, args, proc.pid, loop)
        finally:
            stop_server(proc)
    if tmp is not None:
        tmp.cleanup()
    if args.no_torch:
        return
    torch_all = [torch_rows(args.ops, args.clients, args.ops_each) for _ in range(args.repeat)]
    torch_runs = [r for r in torch_all if r is not None]
    if not torch_runs:
        print("torch is not installed: no TCPStore comparison")
        return
    version = importlib.import_module("torch").__version__
    print(f"[torch {version} TCPStore (C++ server thread, same process), median of {args.repeat}]")
    theirs: dict[str, float] = {}
    for name, label in (("put", "set"), ("get", "get"), ("concurrent", "concurrent")):
        theirs[name] = statistics.median(r[name] for r in torch_runs)
        spread = ", ".join(f"{r[name]:,.0f}" for r in torch_runs)
        cpu = ""
        if f"{name}_cpu" in torch_runs[0]:
            per_op = statistics.median(r[f"{name}_cpu"] for r in torch_runs) * 1e6
            cpu = f"   CPU/op: {per_op:.0f} us (server thread + client, one process)"
        print(
            f"  {label:<11} {theirs[name]:>10,.0f} ops/s   aioelastic/TCPStore = "
            f"{ours[name] / theirs[name]:.2f}   (runs: {spread}){cpu}"
        )
    print(
        f"  aioelastic's {args.in_flight} gets in flight / TCPStore's sequential get = "
        f"{ours['pipelined'] / theirs['get']:.2f}"
    )


if __name__ == "__main__":
    main()
