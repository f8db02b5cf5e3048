"""Server CPU per rendezvous join, measured on the server's own thread.

One :class:`~aioelastic.store.http.server.HttpStoreServer` runs on an event loop in a thread
(:class:`aioelastic.testing.http.ServerThread`); N dynamic handlers, each over its own
``http://`` store (one session each, as N processes would have), run rounds from the main
thread: a first round, then rounds in which every member rejoins. The figure is the server
thread's CPU time (``time.thread_time()`` read on that thread) over each round, divided by N,
so the clients' CPU (in this process) is not in it. ``--profile`` adds the server thread's top
functions by own time (cProfile on that thread only, which inflates the figures: compare the
shares, not the times).

    PYTHONPATH=. nice -n 5 python -m benchmarks.server_join_cpu --n 64 --rounds 5 [--profile]

It is the quick, in-process companion of ``benchmarks/rdzv_processes.py`` (whose "server CPU
per join" is the ``aioelastic serve`` process over a round of N separate processes) and of
``benchmarks/server_join_procs.py`` (the same figure over light processes, with the server's
system calls and operations per join, and ``--against`` another checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import time
import uuid

from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.store import open_store
from aioelastic.testing.http import ServerThread


async def _thread_cpu() -> float:
    return time.thread_time()


async def _rounds(server: ServerThread, n: int, rounds: int, ttl: float) -> list[float]:
    """The server thread's CPU seconds per join of each round."""
    run_id = f"cpu-{uuid.uuid4().hex[:8]}"
    stores = [await open_store(server.url) for _ in range(n)]
    handlers = [
        DynamicRendezvousHandler(
            store, run_id, n, n, local_addr="127.0.0.1", lease_ttl=ttl, owns_store=True
        )
        for store in stores
    ]
    per_join = []
    try:
        for _ in range(rounds):
            before = server.call(_thread_cpu())  # (blocks this loop a moment: between rounds)
            results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
            after = server.call(_thread_cpu())
            if sorted(r.rank for r in results) != list(range(n)):
                raise AssertionError(f"ranks of the round of {n} are not 0..{n - 1}")
            per_join.append((after - before) / n)
    finally:
        await asyncio.gather(*(h.aclose() for h in handlers))
    return per_join


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64, help="handlers (sessions) per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds: a first, then rejoins")
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--profile", action="store_true", help="the server thread's top functions")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    # CPU time of the thread, not wall time (which would count the waits in epoll)
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    with ServerThread() as server:
        if profile is not None:
            server.call(_enable(profile))
        per_join = asyncio.run(_rounds(server, args.n, args.rounds, args.lease_ttl))
        if profile is not None:
            server.call(_disable(profile))
    first, rejoins = per_join[0], per_join[1:]
    print(f"N={args.n}: server thread CPU per join, first round {first * 1e6:.0f} us", end="")
    if rejoins:
        print(
            f"; rejoin rounds median {statistics.median(rejoins) * 1e6:.0f} us "
            f"({min(rejoins) * 1e6:.0f}-{max(rejoins) * 1e6:.0f}, {len(rejoins)} rounds)"
        )
    else:
        print()
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())


async def _enable(profile: cProfile.Profile) -> None:
    profile.enable()  # on the server's thread: cProfile hooks the thread that enables it


async def _disable(profile: cProfile.Profile) -> None:
    profile.disable()


if __name__ == "__main__":
    main()
