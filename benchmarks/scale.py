"""Scale benchmark: one rendezvous round of N nodes (min = max = N), how long it takes and how
much work it costs: events delivered to watchers, store writes, round state bytes.

Modes (``--mode``):

- ``memory``: N handlers as tasks in this process over one memory engine (the engine counts
  its work, see :class:`aioelastic.store.memory.EngineWork`);
- ``simulate``: the same under the test kit's virtual-time loop (lease keep-alives, join and
  last-call deadlines never fire in real time), for N far beyond what one loop runs in real
  time, e.g. 100,000;
- ``http``: one ``aioelastic serve`` process and N handlers spread over ``--clients`` client
  processes (8), each opening its store over http, all starting at a shared wall-clock t0.

::

    python -m benchmarks.scale                                 # memory, N = 1k, 2k, 5k, 10k
    python -m benchmarks.scale --sizes 1000,10000 --repeat 3 --plot docs/benchmarks/scale.png
    python -m benchmarks.scale --mode simulate --sizes 100000
    python -m benchmarks.scale --mode http --sizes 1000,2000
    python -m benchmarks.scale --mode http --sizes 10000 --kill
    python -m benchmarks.scale --sizes 1000,10000 --kill  # the same loss in process
    python -m benchmarks.scale --sizes 1000,10000 --repeat 3 --also-frozen

Prints the median and range of t(N) per size, t(N) / t(first size) beside N / first size, and
the per-round work. ``--json PATH`` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aioelastic.rendezvous import (
    DynamicRendezvousHandler,
    RendezvousEvent,
    RendezvousEventKind,
    RendezvousResult,
)
from aioelastic.rendezvous._state import RunKeys
from aioelastic.store import MemoryEngine, MemoryStore, WatchEvent
from aioelastic.testing import run_virtual

SIZES = (1000, 2000, 5000, 10_000)


@dataclass(frozen=True, slots=True)
class RoundFigures:
    """One round of ``n`` nodes: time from all started to all returned, and its work.

    ``seconds`` is wall-clock time, ``cpu_seconds`` this process's CPU time over the same span
    (on a loaded machine the fairer figure). ``events``: events delivered to watchers while
    the round formed; ``writes``: store writes (revisions); ``watcher_visits`` and
    ``keys_scanned``: the engine's work counters; the bytes are
    the round record every member reads (``c/round``), every key and value of the run at
    completion (node records and the roster included), and ``event_bytes`` the keys and values
    of every event delivered to a watcher (memory: counted by :class:`CountingEngine`).
    ``roster_bytes``: the round's roster (what the driver writes, and a tool or a handler with
    ``participants`` reads). Counters are None where the store does not count
    (http: another process); there ``cpu_seconds`` is the server's CPU time over the round and
    ``server_rss_bytes`` its resident memory after it.
    """

    n: int
    seconds: float
    cpu_seconds: float
    events: int | None
    writes: int | None
    watcher_visits: int | None
    keys_scanned: int | None
    record_bytes: int
    state_bytes: int
    server_rss_bytes: int | None = None
    #: http: bytes of the event frames the clients received, their CPU time over the round,
    #: and the connection attempts they tried again (refused, timed out, 503)
    event_bytes: int | None = None
    client_cpu_seconds: float | None = None
    connect_retries: int | None = None
    #: http ``--kill``: SIGKILL to every other member having seen the loss, then to the last
    #: return of the round of N - 1
    lost_seen_seconds: float | None = None
    new_round_seconds: float | None = None
    #: http ``--kill``: seconds after the kill of each moment of the loss (the server's, the
    #: survivors'; ``benchmarks.scale_http.kill_timeline``)
    kill_timeline: dict[str, float] | None = None
    roster_bytes: int | None = None
    #: memory/simulate: CPU time inside the cyclic garbage collector over the round, that of its
    #: full (generation 2) collections, and how many full collections ran
    gc_seconds: float | None = None
    gc_full_seconds: float | None = None
    gc_full: int | None = None

    def per_node(self, value: int | None) -> float | None:
        return None if value is None else value / self.n


class GcMeter:
    """CPU time (this thread's) the cyclic collector spends while installed, and its full
    collections: with N participants alive in one process, each full one traverses them all."""

    def __init__(self) -> None:
        self.seconds = self.full_seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        spent = time.thread_time() - self._started
        self.seconds += spent
        if info["generation"] == 2:
            self.full += 1
            self.full_seconds += spent


class CountingEngine(MemoryEngine):
    """A memory engine that also counts the bytes (keys and values) of the events it hands to
    watchers: what a round sends its nodes, on a store where they are not in this process."""

    event_bytes = 0

    def read_events(self, watcher: Any) -> list[WatchEvent]:
        events = super().read_events(watcher)
        self.event_bytes += sum(len(e.kv.key) + len(e.kv.value) for e in events)
        return events


def make_handlers(
    engine: MemoryEngine, n: int, min_nodes: int | None = None, **kw: Any
) -> list[DynamicRendezvousHandler]:
    """N handlers of one run (min = max = N unless ``min_nodes``), one memory store client each
    over ``engine``; ``participants=False`` unless ``kw`` says otherwise (a member reads its
    member record, not the whole roster: what rounds of thousands want)."""
    low = n if min_nodes is None else min_nodes
    kw.setdefault("participants", False)
    return [
        DynamicRendezvousHandler(
            MemoryStore(engine), "scale", low, n, local_addr="127.0.0.1", owns_store=True, **kw
        )
        for _ in range(n)
    ]


async def timed_round(
    engine: MemoryEngine,
    handlers: Sequence[DynamicRendezvousHandler],
    joins: Callable[[], Sequence[Awaitable[RendezvousResult]]] | None = None,
    *,
    pause_gc: bool = False,
    freeze_gc: bool = False,
) -> RoundFigures:
    """All of ``handlers`` call ``next_rendezvous`` at once (or ``joins()`` starts the round's
    joins, one per handler); the figures of that round. ``pause_gc``: no cyclic garbage
    collection while it forms (what is left is the rendezvous' own work: with N participants'
    objects alive in one process, each full collection traverses all of them). ``freeze_gc``:
    what a user with that many participants in one process does after setting them up,
    ``gc.freeze()``: the objects alive before the round are left out of every collection, the
    collector still runs over what the round makes."""
    n = len(handlers)
    before = engine.work()
    counting = engine if isinstance(engine, CountingEngine) else None
    bytes_before = 0 if counting is None else counting.event_bytes
    if freeze_gc:
        gc.collect()
        gc.freeze()
    if pause_gc:
        gc.disable()
    try:
        with GcMeter() as meter:
            start, cpu = time.perf_counter(), time.process_time()
            started = [h.next_rendezvous() for h in handlers] if joins is None else joins()
            results = await asyncio.gather(*started)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        if pause_gc:
            gc.enable()
        if freeze_gc:
            gc.unfreeze()
    after = engine.work()
    if sorted(r.rank for r in results) != list(range(n)):
        raise AssertionError(f"ranks of the round of {n} are not 0..{n - 1} exactly once")
    keys = RunKeys(handlers[0].run_id)
    record = engine.get(keys.round)
    assert record is not None
    state = engine.range(keys.root)
    roster = engine.range(keys.roster)
    return RoundFigures(
        n=n,
        seconds=seconds,
        cpu_seconds=cpu,
        events=after.events_delivered - before.events_delivered,
        writes=after.writes - before.writes,
        watcher_visits=after.watcher_visits - before.watcher_visits,
        keys_scanned=after.keys_scanned - before.keys_scanned,
        record_bytes=len(record.value),
        state_bytes=sum(len(kv.key) + len(kv.value) for kv in state.kvs),
        event_bytes=None if counting is None else counting.event_bytes - bytes_before,
        roster_bytes=sum(len(kv.key) + len(kv.value) for kv in roster.kvs),
        gc_seconds=meter.seconds,
        gc_full_seconds=meter.full_seconds,
        gc_full=meter.full,
    )


async def memory_rounds(
    n: int,
    rounds: int = 1,
    history_limit: int | None = None,
    *,
    pause_gc: bool = False,
    freeze_gc: bool = False,
) -> list[RoundFigures]:
    """``rounds`` rounds of the same N nodes (each later one: every member rejoins).

    ``history_limit``: the engine's (default: its default, 10,000 events): below about N, the
    nodes' watches of ``c/`` fall behind a compaction while N registrations are written, and
    each node reads ``c/`` afresh instead of getting its events (fewer events, more reads).
    """
    engine = (
        CountingEngine() if history_limit is None else CountingEngine(history_limit=history_limit)
    )
    handlers = make_handlers(engine, n)
    try:
        return [
            await timed_round(engine, handlers, pause_gc=pause_gc, freeze_gc=freeze_gc)
            for _ in range(rounds)
        ]
    finally:
        await asyncio.gather(*(h.aclose() for h in handlers))
        engine.close()


async def newcomer_round(n: int) -> RoundFigures:
    """N members wait in ``wait_for_change``; a newcomer arrives and every member rejoins at
    its ``NODES_WAITING``: the figures of that N+1 round (min = N, max = N + 1)."""
    engine = CountingEngine()
    handlers = make_handlers(engine, n + 1, min_nodes=n, last_call_timeout=0.0)
    members, newcomer = handlers[:n], handlers[n]
    try:
        await asyncio.gather(*(h.next_rendezvous() for h in members))
        changes = [asyncio.ensure_future(h.wait_for_change()) for h in members]
        await asyncio.sleep(0.1)  # every member's watch is open (virtual time: at once)

        def joins() -> list[Awaitable[RendezvousResult]]:
            rejoins = [_rejoin(h, c) for h, c in zip(members, changes, strict=True)]
            return [*rejoins, newcomer.next_rendezvous()]

        return await timed_round(engine, handlers, joins)
    finally:
        await asyncio.gather(*(h.aclose() for h in handlers))
        engine.close()


async def _rejoin(
    h: DynamicRendezvousHandler, change: asyncio.Future[RendezvousEvent]
) -> RendezvousResult:
    event = await change
    if event.kind is not RendezvousEventKind.NODES_WAITING:
        raise AssertionError(f"a member saw {event}, not the newcomer")
    return await h.next_rendezvous()


def run_memory(
    n: int,
    rounds: int = 1,
    history_limit: int | None = None,
    *,
    pause_gc: bool = False,
    freeze_gc: bool = False,
) -> list[RoundFigures]:
    return asyncio.run(
        memory_rounds(n, rounds, history_limit, pause_gc=pause_gc, freeze_gc=freeze_gc)
    )


def run_simulated(
    n: int,
    rounds: int = 1,
    history_limit: int | None = None,
    *,
    pause_gc: bool = False,
    freeze_gc: bool = False,
) -> list[RoundFigures]:
    """:func:`memory_rounds` under the virtual-time loop (``seconds`` stays real time)."""
    return run_virtual(
        memory_rounds(n, rounds, history_limit, pause_gc=pause_gc, freeze_gc=freeze_gc)
    )


# -- reporting


def _ratio(value: float, base: float) -> str:
    """``value / base`` for the table, "-" when the base is 0 (a CPU time under the clock's
    tick, as in a tiny run)."""
    return f"{value / base:.2f}" if base > 0 else "-"


def summary(sizes: Sequence[int], runs: dict[int, list[RoundFigures]]) -> str:
    first = sizes[0]
    base = statistics.median(f.seconds for f in runs[first])
    base_cpu = statistics.median(f.cpu_seconds for f in runs[first])
    lines = [
        f"{'N':>7} {'wall median':>11} {'range':>15} {'cpu median':>10} {'t/t0':>5} {'cpu/c0':>6} "
        f"{'N/N0':>5} {'events/N':>8} {'ev B/N':>7} {'writes/N':>8} {'visits/N':>8} "
        f"{'record B':>9} {'roster B':>10} {'state B':>10}"
    ]
    for n in sizes:
        figures = runs[n]
        times = [f.seconds for f in figures]
        med = statistics.median(times)
        cpu = statistics.median(f.cpu_seconds for f in figures)
        f = figures[0]

        def per(value: int | None, f: RoundFigures = f) -> str:
            v = f.per_node(value)
            return "-" if v is None else f"{v:.2f}"

        roster = "-" if f.roster_bytes is None else f"{f.roster_bytes:,}"
        lines.append(
            f"{n:>7} {med:>10.3f}s {min(times):>6.3f}-{max(times):.3f}s {cpu:>9.3f}s "
            f"{_ratio(med, base):>5} {_ratio(cpu, base_cpu):>6} {n / first:>5.1f} "
            f"{per(f.events):>8} "
            f"{per(f.event_bytes):>7} {per(f.writes):>8} {per(f.watcher_visits):>8} "
            f"{f.record_bytes:>9,} {roster:>10} {f.state_bytes:>10,}"
        )
    return "\n".join(lines)


def gc_details(n: int, figures: Sequence[RoundFigures]) -> str:
    """CPU time per round (range), and the collector's share of it: medians and ranges."""

    def spread(values: Sequence[float]) -> str:
        return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"

    cpu = spread([f.cpu_seconds for f in figures])
    if any(f.gc_seconds is None for f in figures):
        return f"N={n}: cpu {cpu}"
    gc_all = spread([f.gc_seconds or 0.0 for f in figures])
    full = spread([f.gc_full_seconds or 0.0 for f in figures])
    counts = "/".join(str(f.gc_full) for f in figures)
    return f"N={n}: cpu {cpu}; in the collector {gc_all}, in full collections {full} ({counts})"


def http_details(figures: Sequence[RoundFigures]) -> str:
    """The http figures beyond the table, per run: the clients' side and ``--kill``'s."""
    lines = []
    for f in figures:
        line = (
            f"  N={f.n}: t(N) {f.seconds:.3f} s; events {f.events} ({f.per_node(f.events):.2f}/N), "
            f"event bytes {f.event_bytes:,} ({f.per_node(f.event_bytes):.0f}/N), writes "
            f"{f.writes} ({f.per_node(f.writes):.2f}/N); clients' CPU {f.client_cpu_seconds:.2f} s "
            f"({(f.client_cpu_seconds or 0) / f.n * 1e6:.0f} us per node); connection attempts "
            f"tried again {f.connect_retries}"
        )
        if f.lost_seen_seconds is not None:
            line += (
                f"\n  N={f.n} --kill: every other member saw the SIGKILLed one lost "
                f"{f.lost_seen_seconds:.3f} s after the kill; the round of {f.n - 1} returned "
                f"{f.new_round_seconds:.3f} s after that (it forms once every survivor registered "
                "again, without waiting out its last call: fast_reform)"
            )
        if f.kill_timeline:
            line += "\n    timeline after the kill: " + timeline_text(f.kill_timeline)
        lines.append(line)
    return "\n".join(lines)


def timeline_text(timeline: dict[str, float]) -> str:
    """The moments of ``--kill``'s loss in order, in seconds after the kill."""
    order = ("detached", "revoking", "revoked", "written", "first_seen", "last_seen")
    text = ", ".join(f"{what} {timeline[what]:.3f}" for what in order if what in timeline) + " s"
    if "written_cpu" in timeline:
        text += (
            f" (the server wrote {timeline.get('written_count', 0):.0f} connections with "
            f"{timeline['written_cpu'] * 1e3:.0f} ms of CPU)"
        )
    return text


def plot(
    sizes: Sequence[int],
    runs: dict[int, list[RoundFigures]],
    path: Path,
    title: str,
    also: dict[str, dict[int, list[RoundFigures]]] | None = None,
) -> bool:
    """t(N), wall clock and CPU, beside linear (through the first size's CPU time), and the CPU
    time of the runs in ``also`` (label -> runs); False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'aioelastic[bench]'): no plot written")
        return False
    med = [statistics.median(f.seconds for f in runs[n]) for n in sizes]
    low = [m - min(f.seconds for f in runs[n]) for m, n in zip(med, sizes, strict=True)]
    high = [max(f.seconds for f in runs[n]) - m for m, n in zip(med, sizes, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    cpu = [statistics.median(f.cpu_seconds for f in runs[n]) for n in sizes]
    ax.errorbar(sizes, med, yerr=[low, high], fmt="o-", capsize=3, label="t(N), wall clock")
    what = "server CPU" if runs[sizes[0]][0].events is None else "CPU"
    ax.plot(sizes, cpu, "s-", label=f"t(N), {what} time")
    for label, other in (also or {}).items():
        xs = [n for n in sizes if n in other]
        ax.plot(xs, [statistics.median(f.cpu_seconds for f in other[n]) for n in xs], "^-",
                label=f"t(N), {what} time, {label}")  # fmt: skip
    ax.plot(sizes, [cpu[0] * n / sizes[0] for n in sizes], "k--", label="linear from the first N")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes N (min = max = N)")
    ax.set_ylabel("all started -> all returned (s, log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def load_runs(path: Path) -> dict[str, dict[int, list[RoundFigures]]]:
    """The runs of a ``--json`` file, labelled for :func:`plot`."""
    data = json.loads(path.read_text())
    runs = {int(n): [RoundFigures(**f) for f in figures] for n, figures in data["runs"].items()}
    label = (
        "GC paused"
        if data.get("pause_gc")
        else "gc.freeze() after set-up"
        if data.get("freeze_gc")
        else f"{data['mode']} ({path.name})"
    )
    return {label: runs}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--mode", choices=("memory", "simulate", "http", "etcd"), default="memory")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--repeat", type=int, default=1, help="rounds timed per size")
    parser.add_argument("--clients", type=int, default=8, help="http: client processes")
    parser.add_argument(
        "--join-timeout", type=float, default=60.0, help="http: the handlers' (default 60 s)"
    )
    parser.add_argument(
        "--lease-ttl", type=float, default=15.0, help="http: the handlers' (default 15 s)"
    )
    parser.add_argument(
        "--client-loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="http: the client processes' event loop (auto: uvloop when installed, as "
        "aioelastic serve and the torchrun adapter)",
    )
    parser.add_argument(
        "--kill",
        action="store_true",
        help="http: SIGKILL one member (a process of its own) after the round; time until every "
        "other member saw it, then the round of N - 1; memory/simulate: the same in process, the "
        "member's lease revoked (benchmarks/scale_loss.py), instead of the rounds' table",
    )
    parser.add_argument(
        "--pause-gc", action="store_true", help="memory/simulate: no cyclic GC during a round"
    )
    parser.add_argument(
        "--freeze-gc",
        action="store_true",
        help="memory/simulate: gc.freeze() after set-up (the participants left out of every "
        "collection; the collector still runs)",
    )
    parser.add_argument(
        "--also-frozen",
        action="store_true",
        help="memory/simulate: also time each size with gc.freeze() after set-up, printed as "
        "extra rows below the normal ones (what a user with that many participants in one "
        "process would do; the targets are the normal rows)",
    )
    parser.add_argument("--history-limit", type=int, help="memory/simulate: the engine's")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="memory/simulate: rounds per run (the table: the first; --json: all)",
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--plot", type=Path, help="write t(N) beside linear here (matplotlib)")
    parser.add_argument(
        "--plot-also", type=Path, help="with --plot: the CPU time of another run's --json too"
    )
    args = parser.parse_args(argv)
    if args.client_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        parser.error("--client-loop uvloop needs the uvloop package (pip install uvloop)")
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    if not args.sizes or min(args.sizes) < 1 or args.repeat < 1:
        parser.error("--sizes needs positive integers, --repeat >= 1")
    return args


def measure(args: argparse.Namespace, n: int, failures: dict[int, str]) -> list[RoundFigures]:
    if args.mode == "etcd":
        from benchmarks.scale_etcd import measure as measure_etcd  # a 3-member cluster

        return measure_etcd(n, args.clients, args.repeat, failures)
    if args.mode == "http":
        from benchmarks.scale_http import run_http  # a module of its own: processes, serve

        figures = []
        for _ in range(args.repeat):
            try:
                figures.append(
                    run_http(
                        n,
                        args.clients,
                        kill=args.kill,
                        join_timeout=args.join_timeout,
                        lease_ttl=args.lease_ttl,
                        client_loop=args.client_loop,
                    )
                )
            except (RuntimeError, AssertionError, OSError) as exc:  # reported, not hidden
                failures[n] = str(exc)
                print(f"http: N={n} failed: {exc}", file=sys.stderr, flush=True)
                break
        return figures
    # a fresh run per repeat: each is a first round of N new nodes
    run = run_simulated if args.mode == "simulate" else run_memory
    return [
        f
        for _ in range(args.repeat)
        for f in run(
            n, args.rounds, args.history_limit, pause_gc=args.pause_gc, freeze_gc=args.freeze_gc
        )
    ]


def print_frozen(args: argparse.Namespace, sizes: Sequence[int]) -> None:
    """``--also-frozen``: the same rounds with ``gc.freeze()`` after set-up, labelled."""
    frozen: dict[int, list[RoundFigures]] = {}
    run = run_simulated if args.mode == "simulate" else run_memory
    for n in sizes:
        print(f"{args.mode}: N={n} x {args.repeat}, gc.freeze() after set-up", file=sys.stderr)
        frozen[n] = [
            f
            for _ in range(args.repeat)
            for f in run(n, args.rounds, args.history_limit, freeze_gc=True)
        ]
    print(
        "\nextra rows, NOT the target's figure: gc.freeze() after set-up (the participants "
        "left out of every collection; the collector still runs over what the round makes)"
    )
    print(summary(sizes, frozen))
    for n in sizes:
        print(gc_details(n, frozen[n]))


def main_loss(args: argparse.Namespace) -> int:
    """``--kill`` on the memory store: :mod:`benchmarks.scale_loss`'s runs, their lines."""
    from benchmarks.scale_loss import loss_details, run_loss

    runs = {}
    for n in args.sizes:
        print(f"{args.mode}: N={n} x {args.repeat}, one member lost", file=sys.stderr, flush=True)
        simulate = args.mode == "simulate"
        runs[n] = [run_loss(n, args.history_limit, simulate=simulate) for _ in range(args.repeat)]
        print(loss_details(runs[n]))
    if args.json is not None:
        data = {
            "mode": args.mode,
            "kill": True,
            "runs": {n: [asdict(f) for f in runs[n]] for n in runs},
        }
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


def _layout(args: argparse.Namespace) -> str:
    if args.mode != "http":
        return ""
    from benchmarks.scale_http import client_loop_name

    return f", {args.clients} client processes on {client_loop_name(args.client_loop)}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kill and args.mode in ("memory", "simulate"):
        return main_loss(args)
    runs: dict[int, list[RoundFigures]] = {}
    failures: dict[int, str] = {}
    for n in args.sizes:
        print(f"{args.mode}: N={n} x {args.repeat}{_layout(args)}", file=sys.stderr, flush=True)
        figures = measure(args, n, failures)
        if figures:
            runs[n] = figures
    sizes = [n for n in args.sizes if n in runs]
    if sizes:
        print(summary(sizes, runs))
    if args.mode in ("memory", "simulate"):
        for n in sizes:
            print(gc_details(n, runs[n]))
        if args.also_frozen and not args.freeze_gc and sizes:
            print_frozen(args, sizes)
    for n, why in failures.items():
        print(f"N={n}: FAILED: {why}")
    if args.mode == "http":
        for n in sizes:
            rss = runs[n][0].server_rss_bytes or 0
            cpu = statistics.median(f.cpu_seconds for f in runs[n])
            print(f"N={n}: server CPU {cpu:.2f} s ({cpu / n * 1e6:.0f} us per join), "
                  f"RSS {rss / 2**20:.0f} MiB")  # fmt: skip
            print(http_details(runs[n]))
    if args.json is not None:
        data = {
            "mode": args.mode,
            "pause_gc": args.pause_gc,
            "freeze_gc": args.freeze_gc,
            "runs": {n: [asdict(f) for f in runs[n]] for n in runs},
            "failures": failures,
        }
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    if args.plot is not None:
        layout = f"{args.clients} client processes" if args.mode == "http" else "tasks"
        title = f"one rendezvous round, {args.mode} store, {layout}"
        also = None if args.plot_also is None else load_runs(args.plot_also)
        if len(sizes) > 1 and plot(sizes, runs, args.plot, title, also):
            print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
