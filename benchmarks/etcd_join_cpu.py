"""The etcd client's CPU per rendezvous join: N handlers in one process over a 3-member etcd.

    PYTHONPATH=. nice -n 5 python benchmarks/etcd_join_cpu.py [--n 250] [--repeat 5]
        [--against /path/to/other/checkout]

What one of ``benchmarks.scale --mode etcd``'s client processes does (250 of the 2,000
handlers, a store each, ``participants`` off), without the other seven: the CPU of the client
alone, which a loaded host's wall time hides. One cluster for the whole run; each round is a
fresh client process (a new run id) that measures its own CPU (``time.process_time()``, gRPC's
threads included) and its main thread's (``time.thread_time()``) from the first
``next_rendezvous`` to the last return, and the members' CPU over the same span (``/proc``).
With ``--against DIR`` the rounds alternate between this checkout and the one in ``DIR``, so
before/after figures come from one run; it prints the median and range of the rounds per
checkout, in µs per join, and the ratio of the medians and of each adjacent pair.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMBERS = 3


async def _child(url: str, n: int, pids: list[int]) -> dict[str, float]:
    from aioelastic.rendezvous import DynamicRendezvousHandler
    from aioelastic.store import open_store
    from benchmarks.scale_http import _proc_cpu_rss

    run_id = f"cpu-{uuid.uuid4().hex[:8]}"
    stores = [await open_store(url) for _ in range(n)]
    handlers = [
        DynamicRendezvousHandler(
            store,
            run_id,
            n,
            n,
            local_addr="127.0.0.1",
            join_timeout=120,
            lease_ttl=15,
            last_call_timeout=30,
            participants=False,
            owns_store=True,
        )
        for store in stores
    ]
    members = sum(_proc_cpu_rss(pid)[0] for pid in pids)
    cpu, main, wall = time.process_time(), time.thread_time(), time.perf_counter()
    results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    cpu, main = time.process_time() - cpu, time.thread_time() - main
    wall = time.perf_counter() - wall
    members = sum(_proc_cpu_rss(pid)[0] for pid in pids) - members
    if sorted(r.rank for r in results) != list(range(n)):
        raise SystemExit("not every rank came back once")
    await asyncio.gather(*(h.aclose() for h in handlers))
    return {"client": cpu / n * 1e6, "main": main / n * 1e6, "members": members / n * 1e6,
            "wall": wall}  # fmt: skip


def _round(code: Path, url: str, n: int, pids: list[int]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(code))
    child = [sys.executable, __file__, "--child", url]  # this script, the other's package
    child += ["--n", str(n), "--pids", ",".join(map(str, pids))]
    done = subprocess.run(child, env=env, capture_output=True, text=True, check=False, cwd=code)
    if done.returncode != 0:
        raise SystemExit(f"a client round failed ({code}):\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):7.0f} [{min(values):5.0f}-{max(values):5.0f}]"


def _report(results: dict[Path, list[dict[str, float]]], n: int, repeat: int) -> None:
    codes = list(results)
    print(
        f"etcd client CPU per join (µs), {n} handlers in one process, 3 members, median [range] "
        f"of {repeat} rounds, load average {os.getloadavg()[0]:.1f}"
    )
    for code in codes:
        rounds = results[code]
        cells = "  ".join(
            f"{name} {_cell([r[name] for r in rounds])}" for name in ("client", "main", "members")
        )
        walls = [r["wall"] for r in rounds]
        print(f"  {str(code)[-40:]:>40}: {cells}  wall {statistics.median(walls):.2f} s")
    if len(codes) == 2:
        mine, theirs = results[codes[0]], results[codes[1]]
        for name in ("client", "main"):
            ratio = statistics.median(r[name] for r in mine) / statistics.median(
                r[name] for r in theirs
            )
            pairs = ", ".join(f"{a[name] / b[name]:.2f}" for a, b in zip(mine, theirs, strict=True))
            print(f"  ratio this/against, {name}: {ratio:.2f} (pairs: {pairs})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=250, help="handlers in the process")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per checkout")
    parser.add_argument("--against", type=Path, help="another checkout, alternated (before)")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        pids = [int(p) for p in args.pids.split(",") if p]
        print(json.dumps(asyncio.run(_child(args.child, args.n, pids))))
        return

    sys.path.insert(0, str(ROOT))
    from aioelastic.etcd_server import EtcdServer

    codes = [ROOT] + ([args.against.resolve()] if args.against else [])
    server = EtcdServer(MEMBERS)
    asyncio.run(server.start())
    results: dict[Path, list[dict[str, float]]] = {code: [] for code in codes}
    try:
        pids = [pid for pid in server.pids if pid is not None]
        for _ in range(args.repeat):
            for code in codes:
                results[code].append(_round(code, server.url, args.n, pids))
    finally:
        asyncio.run(server.aclose())
    _report(results, args.n, args.repeat)


if __name__ == "__main__":
    main()
