"""Rendezvous benchmark: N nodes in one process (one event loop, one store client each) over the
memory store, an ``aioelastic serve`` process, or a real etcd.

Prints, for the dynamic handler:
- exact-size rounds (min=max=N): time from all nodes started to all returned;
- elastic rounds (min < N < max): completion lateness after the last-call deadline;
- a new node joining a completed round of N: time until every member has seen it
  (NODES_WAITING), and until the N+1 round (max allows it at once) has completed;
- a dead node (no keep-alive, lease not revoked): time until every survivor has seen it;
- round record size per member.
With ``--torch`` and torch installed, it times torch's c10d DynamicRendezvousHandler (TCPStore,
one thread per node) for the same exact-size rounds and prints the ratio.

    PYTHONPATH=. python benchmarks/rendezvous.py [--store memory|http|etcd] [--sizes 2,8,64]
        [--repeat 3] [--torch]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousEventKind
from aioelastic.rendezvous._state import RunKeys
from aioelastic.store import MemoryEngine, MemoryStore, Store, Watch, open_store

Result = tuple[float, ...]


class Stores:
    """Where the nodes' store clients come from: one shared memory engine per run, or one
    client per node of a real server (``http://...`` from ``aioelastic serve``, ``etcd://...``)."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.kind = "memory" if url is None else url.split("://")[0]

    async def open(self, n: int) -> list[Store]:
        if self.url is None:
            engine = MemoryEngine()
            return [MemoryStore(engine) for _ in range(n)]
        return list(await asyncio.gather(*(open_store(self.url) for _ in range(n))))


STORES = Stores(None)


async def make(n: int, min_nodes: int, max_nodes: int, **kw: Any) -> list[DynamicRendezvousHandler]:
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    stores = await STORES.open(n)
    return [
        DynamicRendezvousHandler(
            store, run_id, min_nodes, max_nodes, local_addr="127.0.0.1", owns_store=True, **kw
        )
        for store in stores
    ]


async def close_all(handlers: Sequence[DynamicRendezvousHandler]) -> None:
    await asyncio.gather(*(h.aclose() for h in handlers))


async def exact_round(n: int) -> tuple[float, int]:
    """Seconds from all N started to all returned; round-record bytes."""
    handlers = await make(n, n, n)
    start = time.perf_counter()
    results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    elapsed = time.perf_counter() - start
    assert sorted(r.rank for r in results) == list(range(n))
    record = await handlers[0].store.get(RunKeys(handlers[0].run_id).round)
    assert record is not None
    await close_all(handlers)
    return elapsed, len(record.value)


async def elastic_round(n: int, last_call: float) -> float:
    """Seconds after the last-call deadline at which the last of N nodes returned (min 1)."""
    handlers = await make(n, 1, n + 1, last_call_timeout=last_call)
    await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    stats = [h.statistics() for h in handlers]
    deadlines = [st.last_call_deadline for st in stats if st.rounds_driven]
    completed = [st.completed_at for st in stats]
    assert len(deadlines) == 1
    assert deadlines[0] is not None
    assert all(t is not None for t in completed)
    await close_all(handlers)
    return max(t for t in completed if t is not None) - deadlines[0]


async def new_node(n: int) -> tuple[float, float]:
    """A node joins a completed round of N: (all members saw it, the N+1 round completed)."""
    # min=N, no last call: the first round forms at N; the N+1 round (max) forms at once
    handlers = await make(n + 1, n, n + 1, last_call_timeout=0.0)
    members, late = handlers[:n], handlers[n]
    await asyncio.gather(*(h.next_rendezvous() for h in members))
    loop = asyncio.get_running_loop()
    seen: list[float] = []
    done: list[float] = []

    async def member(h: DynamicRendezvousHandler) -> None:
        event = await h.wait_for_change()
        assert event.kind is RendezvousEventKind.NODES_WAITING, event
        seen.append(loop.time())
        # Let the other members take the event before this one rejoins: all N members share
        # this process's one core here, where separate processes would not wait for each other.
        await asyncio.sleep(0)
        await h.next_rendezvous()
        done.append(loop.time())

    watchers = [loop.create_task(member(h)) for h in members]
    # every member waits on its watch (opened, and the registrations counted: 3 requests each)
    await asyncio.sleep(0.1 + 0.004 * n)
    start = loop.time()
    result = await late.next_rendezvous()
    done.append(loop.time())
    await asyncio.gather(*watchers)
    assert result.world_size == n + 1
    await close_all(handlers)
    return max(seen) - start, max(done) - start


async def dead_node(n: int, ttl: float) -> float:
    """Seconds after the lease TTL at which every survivor saw a SIGKILLed-like node go."""
    handlers = await make(n, n, n, lease_ttl=ttl)
    await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    victim, survivors = handlers[0], handlers[1:]
    loop = asyncio.get_running_loop()
    seen: list[float] = []

    async def watch(h: DynamicRendezvousHandler) -> None:
        event = await h.wait_for_change()
        assert event.kind is RendezvousEventKind.PARTICIPANT_LOST, event
        seen.append(loop.time())

    watchers = [loop.create_task(watch(h)) for h in survivors]
    await asyncio.sleep(0.01)
    lease = victim.lease
    assert lease is not None
    await lease.aclose(revoke=False)  # dies: no more keep-alives, no revoke
    # The store expires the lease a TTL after the last renewal it processed; the keeper's
    # last_renewal is when that renewal's answer came back (a round trip later at most), so
    # the lateness below is at most one round trip short. (A TTL read back from the store is
    # not used: etcd reports whole seconds.)
    stats = lease.statistics()
    expires_at = stats.last_renewal + stats.ttl
    await victim.store.aclose()
    await asyncio.gather(*watchers)
    await close_all(survivors)
    return max(seen) - expires_at


def torch_available() -> bool:
    """Whether torch's elastic rendezvous can be imported."""
    try:
        importlib.import_module("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
    except ImportError:
        return False
    return True


#: Settings of the torch side (see ``torch_handlers``); the failure rows override the keep-alive
TORCH_STORE_TIMEOUT = 120.0


def torch_handlers(
    n: int,
    min_nodes: int,
    max_nodes: int,
    *,
    last_call: float = 30.0,
    keep_alive_interval: float = 5.0,
    keep_alive_max_attempt: int = 3,
    join_timeout: float = 600.0,
) -> tuple[Any, list[Any]]:
    """torch's c10d DynamicRendezvousHandler x N over one TCPStore server (this process), one
    TCPStore client per node, as ``torchrun --rdzv-backend c10d`` builds them.

    Returns (the server store, the handlers); the nodes are meant to run in threads.
    """
    from datetime import timedelta

    c10d = importlib.import_module("torch.distributed")
    backends = importlib.import_module(
        "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"
    )
    dynamic = importlib.import_module("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
    timeout = timedelta(seconds=TORCH_STORE_TIMEOUT)
    server = c10d.TCPStore("127.0.0.1", 0, is_master=True, timeout=timeout)
    run_id = f"bench{n}-{time.monotonic_ns()}"
    handlers: list[Any] = []
    for _ in range(n):
        client = c10d.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout)
        backend = backends.C10dRendezvousBackend(client, run_id)
        handlers.append(
            dynamic.DynamicRendezvousHandler.from_backend(
                run_id,
                client,
                backend,
                min_nodes,
                max_nodes,
                local_addr="127.0.0.1",
                timeout=dynamic.RendezvousTimeout(
                    join=timedelta(seconds=join_timeout), last_call=timedelta(seconds=last_call)
                ),
                keep_alive_interval=keep_alive_interval,
                keep_alive_max_attempt=keep_alive_max_attempt,
            )
        )
    return server, handlers


def torch_join_all(handlers: Sequence[Any], limit: float = 900.0) -> tuple[float, list[Any]]:
    """Run ``next_rendezvous()`` of every handler in its own thread, all started together;
    (seconds from the start to the last return, the results).

    Raises TimeoutError when a node has not returned after ``limit`` seconds (its daemon thread
    is left behind): torch's joins have been seen to hang on a TCPStore call on a loaded
    machine, and a benchmark run must end."""
    import threading

    errors: list[BaseException] = []
    results: list[Any] = [None] * len(handlers)

    def run(i: int, h: Any) -> None:
        try:
            results[i] = h.next_rendezvous()
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(i, h), daemon=True) for i, h in enumerate(handlers)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, start + limit - time.perf_counter()))
    elapsed = time.perf_counter() - start
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        raise TimeoutError(f"{stuck} of torch's {len(threads)} nodes still joining after {limit} s")
    if errors:
        raise errors[0]
    return elapsed, results


def torch_stop(handlers: Sequence[Any]) -> None:
    """Stop the handlers' keep-alive timers. Not ``shutdown()``: that closes the run through
    the store, one 1-second sync at a time, which is not what is being timed."""
    for h in handlers:
        h._stop_heartbeats()


def torch_exact_round(n: int) -> float | None:
    """torch's c10d DynamicRendezvousHandler, min=max=N, one thread per node: seconds from all
    started to all returned (None: torch is not installed)."""
    if not torch_available():
        return None
    server, handlers = torch_handlers(n, n, n)
    try:
        elapsed, results = torch_join_all(handlers)
        assert sorted(r.rank for r in results) == list(range(n))
        return elapsed
    finally:
        torch_stop(handlers)
        del server


def torch_elastic_round(n: int, last_call: float, join_timeout: float = 600.0) -> float:
    """torch, min=1, max=N+1: seconds from all N started to all returned, minus last_call.

    A node that joins after the round completed waits for the next one: with ``join_timeout``
    it raises torch's RendezvousTimeoutError instead of waiting that long."""
    server, handlers = torch_handlers(n, 1, n + 1, last_call=last_call, join_timeout=join_timeout)
    try:
        elapsed, results = torch_join_all(handlers, join_timeout + 30)
        assert all(r.world_size == n for r in results)
        return elapsed - last_call
    finally:
        torch_stop(handlers)
        del server


def torch_failure_round(n: int, ttl: float, last_call: float, attempts: int = 3) -> float:
    """torch, min=2, max=N, keep-alive every ttl/attempts, dead after ``attempts`` missed: a
    completed round of N, then one node goes silent (its keep-alive timer stops: what a
    SIGKILL looks like to the others) and the survivors call ``next_rendezvous()`` at once.
    Seconds from the silence to the survivors' new round (N-1) returned on all of them."""
    server, handlers = torch_handlers(
        n,
        2,
        n,
        last_call=last_call,
        keep_alive_interval=ttl / attempts,
        keep_alive_max_attempt=attempts,
    )
    try:
        torch_join_all(handlers, 60)
        time.sleep(0.2)  # as ours: the round settles before the kill
        victim, survivors = handlers[0], handlers[1:]
        victim._stop_heartbeats()
        elapsed, results = torch_join_all(survivors, 60 + ttl)
        assert all(r.world_size == n - 1 for r in results), [r.world_size for r in results]
        return elapsed
    finally:
        torch_stop(handlers)
        del server


async def _warm_store(url: str, run_id: str) -> Store:
    """A node process's store client, its code paths and connections warmed up with a round
    of one."""
    store = await open_store(url)
    warm = DynamicRendezvousHandler(store, f"{run_id}-warm-{os.getpid()}", 1, 1)
    await warm.next_rendezvous()
    await warm.aclose()
    return store


async def _ready_then_go(store: Store, run_id: str) -> Watch:
    """Say READY (with the watch on the go key up), and return when the runner puts it. Returns
    the watch, to be closed once the timed part is over."""
    go = f"bench-go/{run_id}"
    events = store.watch(go)
    await events.start()
    print("READY", flush=True)
    if await store.get(go) is None:
        await events.__anext__()
    return events


async def _released() -> None:
    """Wait for the runner's line on stdin: every node has returned (so a node's own leaving,
    revoking its lease and closing its watches, is not timed as part of a peer's round)."""
    await asyncio.to_thread(sys.stdin.readline)


async def process_node(url: str, run_id: str, n: int, rounds: int = 1) -> None:
    """One node of ``--processes``: per round, ready, wait for the go key, rendezvous, print the
    wall-clock time it returned, wait to be released, leave."""
    store = await _warm_store(url, run_id)
    for r in range(rounds):
        rid = run_id if rounds == 1 else f"{run_id}-{r}"
        handler = DynamicRendezvousHandler(store, rid, n, n, local_addr="127.0.0.1")
        go = await _ready_then_go(store, rid)
        result = await handler.next_rendezvous()
        print("DONE", time.time(), result.rank, flush=True)
        await _released()
        await go.aclose()
        await handler.aclose()
    await store.aclose()


async def failure_node(url: str, run_id: str, n: int, ttl: float, last_call: float) -> None:
    """One node of the failure benchmark: a round of N (min 2), then report when this node saw
    a member lost and when its next round (without that member) returned."""
    store = await _warm_store(url, run_id)
    handler = DynamicRendezvousHandler(
        store,
        run_id,
        2,
        n,
        lease_ttl=ttl,
        last_call_timeout=last_call,
        local_addr="127.0.0.1",
        owns_store=True,
    )
    go = await _ready_then_go(store, run_id)
    result = await handler.next_rendezvous()
    print("DONE", time.time(), result.world_size, flush=True)
    await go.aclose()
    event = await handler.wait_for_change()
    print("LOST", time.time(), event.kind.name, flush=True)
    result = await handler.next_rendezvous()
    print("AGAIN", time.time(), result.world_size, flush=True)
    await handler.aclose()


def _node_env() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=root if not path else f"{root}{os.pathsep}{path}")


async def _spawn(
    n: int, *args: str, timeout: float = 120.0, batch: int = 8
) -> list[asyncio.subprocess.Process]:
    """Start N node processes, ``batch`` at a time, each batch having said READY before the
    next starts: 128 interpreters importing at once on 2 cores starve the store server and the
    first nodes' lease keep-alives (start-up is not what is timed)."""
    script, env = os.path.abspath(__file__), _node_env()  # noqa: ASYNC240 (no I/O)
    procs: list[asyncio.subprocess.Process] = []
    try:
        while len(procs) < n:
            started = [
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    script,
                    *args,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    env=env,
                )
                for _ in range(min(batch, n - len(procs)))
            ]
            procs += started
            for proc in started:
                await _expect(proc, b"READY", timeout)
    except BaseException:
        await _reap(procs)
        raise
    return procs


async def _reap(procs: Sequence[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def _expect(proc: asyncio.subprocess.Process, word: bytes, timeout: float) -> list[str]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    if not line.startswith(word):
        raise RuntimeError(f"node process said {line!r}, expected {word.decode()}")
    return line.decode().split()


async def _go(url: str, key: str) -> float:
    """Put the go key; the wall-clock time just before it was sent."""
    async with open_store(url) as store:
        start = time.time()
        await store.put(key, b"go")
        return start


async def process_rounds(
    url: str,
    n: int,
    rounds: int,
    between: Callable[[int], object] | None = None,
    timeout: float = 120.0,
) -> list[float]:
    """N node processes, ``rounds`` exact-size rounds: per round, seconds from the go signal to
    the last node returned (wall clock). ``between(r)`` runs (in a thread) after round r, while
    the node processes wait for the next go: how the runner interleaves torch's rounds."""
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    procs = await _spawn(n, "--node", url, run_id, str(n), str(rounds), timeout=timeout)
    try:
        times = []
        for r in range(rounds):
            for proc in procs if r else ():  # the first READY: read by _spawn
                await _expect(proc, b"READY", timeout)
            rid = run_id if rounds == 1 else f"{run_id}-{r}"
            start = await _go(url, f"bench-go/{rid}")
            ends = [float((await _expect(p, b"DONE", timeout))[1]) for p in procs]
            times.append(max(ends) - start)
            for proc in procs:  # all returned: release them (see _released)
                assert proc.stdin is not None
                proc.stdin.write(b"go on\n")
            if between is not None:
                await asyncio.to_thread(between, r)
        for proc in procs:
            await asyncio.wait_for(proc.wait(), timeout)
        return times
    finally:
        await _reap(procs)


async def process_round(url: str, n: int) -> float:
    """N node processes: seconds from the go signal to the last node returned (wall clock)."""
    return (await process_rounds(url, n, 1))[0]


async def process_failure(
    url: str, n: int, ttl: float, last_call: float, timeout: float = 60.0
) -> tuple[float, float]:
    """N node processes over ``url`` complete a round (min 2, max N); one is SIGKILLed.

    Returns seconds from the SIGKILL until (every survivor saw PARTICIPANT_LOST, every survivor
    returned from its next round of N-1), wall clock across processes.
    """
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    procs = await _spawn(
        n, "--fail-node", url, run_id, str(n), str(ttl), str(last_call), timeout=timeout
    )
    try:
        await _go(url, f"bench-go/{run_id}")
        for proc in procs:
            words = await _expect(proc, b"DONE", timeout)
            assert int(words[2]) == n, words
        await asyncio.sleep(0.2)  # the round settles (every node's member watch is up)
        victim, survivors = procs[0], procs[1:]
        killed = time.time()
        victim.kill()
        await victim.wait()
        seen = []
        for proc in survivors:
            words = await _expect(proc, b"LOST", timeout)
            assert words[2] == RendezvousEventKind.PARTICIPANT_LOST.name, words
            seen.append(float(words[1]))
        again = []
        for proc in survivors:
            words = await _expect(proc, b"AGAIN", timeout)
            assert int(words[2]) == n - 1, words
            again.append(float(words[1]))
        for proc in survivors:
            await asyncio.wait_for(proc.wait(), timeout)
        return max(seen) - killed, max(again) - killed
    finally:
        await _reap(procs)


def summary(values: Sequence[float], scale: float = 1000.0) -> str:
    return (
        f"min {min(values) * scale:8.2f}  median {statistics.median(values) * scale:8.2f}  "
        f"max {max(values) * scale:8.2f} ms"
    )


def repeat(count: int, fn: Callable[[int], float], n: int) -> list[float]:
    return [fn(n) for _ in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="2,4,8,16,32,64,128,256,512,1000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--last-call", type=float, default=0.2)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--torch", action="store_true", help="also time torch's c10d handler")
    parser.add_argument("--torch-sizes", default="2,4,8,16")
    parser.add_argument(
        "--store",
        choices=["memory", "http", "etcd"],
        default="memory",
        help="memory (in-process), http (starts `aioelastic serve`), etcd (starts a real etcd)",
    )
    parser.add_argument("--url", help="use this running store instead (http://..., etcd://...)")
    parser.add_argument(
        "--processes",
        default="",
        help="also time exact-size rounds of N node processes (e.g. 2,8,32; http/etcd only)",
    )
    # URL RUN_ID N [ROUNDS]: one node process of --processes
    parser.add_argument("--node", nargs="+", help=argparse.SUPPRESS)
    # URL RUN_ID N TTL LAST_CALL: one node process of the failure benchmark (benchmarks/run.py)
    parser.add_argument("--fail-node", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.node:
        url, run_id, n, *rounds = args.node
        asyncio.run(process_node(url, run_id, int(n), int(rounds[0]) if rounds else 1))
        return 0
    if args.fail_node:
        url, run_id, n, ttl, last_call = args.fail_node
        asyncio.run(failure_node(url, run_id, int(n), float(ttl), float(last_call)))
        return 0
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(serve(args.store))
        global STORES
        STORES = Stores(url)
        return run(args)


@contextlib.contextmanager
def serve(kind: str) -> Iterator[str | None]:
    """Start the store server the benchmark talks to; yield its URL (None for memory)."""
    if kind == "memory":
        yield None
    elif kind == "http":
        proc = subprocess.Popen(
            [sys.executable, "-m", "aioelastic", "serve", "--port", "0"],
            env=_node_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                match = re.search(r"listening on (\S+)", line)
                if match:
                    break
            else:
                raise RuntimeError("aioelastic serve did not start")
            yield match.group(1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    else:
        from aioelastic.etcd_server import EtcdServer

        server = EtcdServer()
        asyncio.run(server.start())
        try:
            yield server.url
        finally:
            asyncio.run(server.aclose())


def run(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    where = STORES.url or "the memory store"
    print(f"aioelastic rendezvous over {where}, python {sys.version.split()[0]}")
    print("\n== exact-size round (min=max=N), all started -> all returned")
    exact: dict[int, float] = {}
    for n in sizes:
        runs = [asyncio.run(exact_round(n)) for _ in range(args.repeat)]
        times = [t for t, _ in runs]
        size = runs[0][1]
        exact[n] = min(times)
        print(f"N={n:5d}  {summary(times)}   round record {size} B = {size / n:.1f} B/member")

    print(
        f"\n== elastic round (min=1, max=N+1, last_call={args.last_call}s): lateness after deadline"
    )
    for n in [s for s in sizes if s <= 256]:
        late = repeat(args.repeat, lambda k: asyncio.run(elastic_round(k, args.last_call)), n)
        print(f"N={n:5d}  {summary(late)}")

    print("\n== a new node joins a completed round of N (max=N+1)")
    for n in [s for s in sizes if s <= 256]:
        joins = [asyncio.run(new_node(n)) for _ in range(args.repeat)]
        seen = [s for s, _ in joins]
        formed = [d for _, d in joins]
        print(f"N={n:5d}  seen by all: {summary(seen)}   N+1 round: {summary(formed)}")

    print(f"\n== dead node (lease TTL {args.ttl}s): seen by every survivor after TTL +")
    for n in [s for s in sizes if 2 <= s <= 256]:
        after = repeat(args.repeat, lambda k: asyncio.run(dead_node(k, args.ttl)), n)
        print(f"N={n:5d}  {summary(after)}")

    if args.processes and STORES.url is not None:
        print(f"\n== exact-size round of N node processes over {STORES.kind}: go -> all returned")
        for n in [int(x) for x in args.processes.split(",")]:
            url = STORES.url
            times = [asyncio.run(process_round(url, n)) for _ in range(args.repeat)]
            print(f"N={n:5d}  {summary(times)}")

    if args.torch:
        print("\n== torch 2.x c10d DynamicRendezvousHandler (TCPStore, thread per node), min=max=N")
        for n in [int(s) for s in args.torch_sizes.split(",")]:
            elapsed = torch_exact_round(n)
            if elapsed is None:
                print("torch is not installed")
                break
            ours = exact.get(n)
            if ours is None:
                ours = min(asyncio.run(exact_round(n))[0] for _ in range(args.repeat))
            print(
                f"N={n:5d}  torch {elapsed * 1000:9.1f} ms   aioelastic {ours * 1000:7.2f} ms   "
                f"ratio {elapsed / ours:8.0f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
