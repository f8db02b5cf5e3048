"""What a *fresh* participant costs over http: its own store and session (connect, upgrade,
hello), its lease, its watch, its registration; this checkout against another in one run.

``PYTHONPATH=. python -m benchmarks.fresh_join [--k 250] [--pairs 3] [--against DIR]``

Each run is one ``aioelastic serve`` and one client process of ``--k`` handlers, each on a new
store, in one round of ``k`` (as a client process of ``benchmarks.scale --mode http`` is, at
N = 8 k). Figures per join: the client process's CPU (``time.process_time()`` around the joins),
the server's CPU (``/proc``), and the client's writes on its session sockets by what they
carried (each write is a send and, on the server, a read: the wake-ups a round trip costs).
``--against DIR`` alternates runs of this checkout with runs of ``DIR`` (another checkout:
both its server and its client), ``--pairs`` times, and prints each side's median and range.
CPU is the figure to compare on a loaded machine; wall time is printed but is the load's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, collections, json, re, subprocess, sys, time, uuid
from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.store import open_store
from aioelastic.store.http._client_conn import Connection
from aioelastic.store.http._frames import unpack_all

k = int(sys.argv[1])
writes = collections.Counter()
made = Connection.connection_made


def kinds(data):
    if data.startswith(b"GET"):
        return "upgrade" + ("+hello" if data.split(b"\r\n\r\n", 1)[1] else "")
    ops = []
    while data:
        n = int.from_bytes(data[:4], "big")
        ops += [frame[2] for frame in unpack_all(data[4 : 4 + n], max_len=1 << 30)]
        data = data[4 + n :]
    return "+".join(ops)


def counting(conn, transport):
    made(conn, transport)
    write = transport.write

    def counted(data):
        writes[kinds(bytes(data))] += 1
        write(data)

    transport.write = counted


Connection.connection_made = counting


def server_cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(url, pid):
    run = f"fresh-{uuid.uuid4().hex[:8]}"
    stores = [await open_store(url, progress_interval=10.0) for _ in range(k)]
    handlers = [
        DynamicRendezvousHandler(
            s, run, k, k, local_addr="127.0.0.1", join_timeout=120, lease_ttl=30,
            last_call_timeout=30.0, participants=False, owns_store=True,
        )
        for s in stores
    ]
    served = server_cpu(pid)
    cpu, wall = time.process_time(), time.perf_counter()
    results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    served = server_cpu(pid) - served
    assert sorted(r.rank for r in results) == list(range(k))
    sent = dict(writes)
    await asyncio.gather(*(h.aclose() for h in handlers), return_exceptions=True)
    return {"cpu": cpu / k, "server": served / k, "wall": wall, "writes": sent}


import os
proc = subprocess.Popen(
    [sys.executable, "-m", "aioelastic", "serve", "--port", "0", "--history-limit", "40000"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
)
try:
    url = re.search(r"listening on (\S+)", proc.stdout.readline()).group(1)
    print(json.dumps(asyncio.run(main(url, proc.pid))))
finally:
    proc.terminate()
    proc.wait(30)
"""


def _run(checkout: Path, k: int) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(k)],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    figures: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return figures


def _spread(values: list[float], scale: float, unit: str) -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):.0f} {unit} ({min(v):.0f}-{max(v):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=250, help="handlers in the client process")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout, run alternately")
    args = parser.parse_args()
    sides = {"this": ROOT}
    if args.against is not None:
        sides["against"] = args.against.resolve()
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in sides}
    for _ in range(args.pairs):
        for name, checkout in sides.items():
            runs[name].append(_run(checkout, args.k))
    print(f"fresh joins over http: k={args.k} handlers on new stores, {args.pairs} runs a side")
    for name, checkout in sides.items():
        got = runs[name]
        cpu = [float(str(r["cpu"])) for r in got]
        server = [float(str(r["server"])) for r in got]
        wall = [float(str(r["wall"])) for r in got]
        print(f"  {name} ({checkout}):")
        print(f"    client CPU per join {_spread(cpu, 1e6, 'us')}")
        print(f"    server CPU per join {_spread(server, 1e6, 'us')}")
        print(f"    round wall {_spread(wall, 1e3, 'ms')}")
        writes = got[-1]["writes"]
        assert isinstance(writes, dict)
        total = sum(writes.values()) / args.k
        print(f"    client writes per join {total:.2f}:")
        for kind, count in sorted(writes.items(), key=lambda item: -item[1]):
            print(f"      {count / args.k:5.2f}  {kind}")
    if args.against is not None:
        mine = statistics.median(float(str(r["cpu"])) for r in runs["this"])
        theirs = statistics.median(float(str(r["cpu"])) for r in runs["against"])
        print(f"  client CPU per join, this / against: {mine / theirs:.2f}")


if __name__ == "__main__":
    main()
