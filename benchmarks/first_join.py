"""The CPU cost of a process's first rendezvous join against a warm one.

``PYTHONPATH=. python benchmarks/first_join.py [--repeat 7] [--warm 5] [--torch]``

Each repetition is a fresh process that creates a dynamic handler through aioelastic's registry
(``create_handler``, as the agent and the torchrun adapter do; a round of one node, no last
call), then times ``time.thread_time()`` around ``next_rendezvous()``: the first join, then
``--warm`` more. Stores: ``memory`` (in the process) and ``http`` (one ``aioelastic serve``
process for every repetition). ``--torch`` imports torch first, for its large heap. Prints the
median and range over the processes of the first join, of the warm joins (each process's
median), and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import uuid

from benchmarks.rdzv_processes import Server, _env

NODE = r"""
import asyncio, json, statistics, sys, time
if sys.argv[4] == "1":
    import torch  # noqa: F401
from aioelastic.rendezvous import RendezvousParameters, create_handler

backend, endpoint, run_id, warm = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[5])


async def main() -> dict[str, object]:
    params = RendezvousParameters(backend, endpoint, run_id, 1, 1, last_call_timeout="0")
    handler = await create_handler(params)
    times = []
    for _ in range(1 + warm):
        cpu = time.thread_time()
        await handler.next_rendezvous()
        times.append(time.thread_time() - cpu)
    await handler.aclose()
    return {"first": times[0], "warm": statistics.median(times[1:])}

print(json.dumps(asyncio.run(main())), flush=True)
"""


def one_process(backend: str, endpoint: str, torch: bool, warm: int) -> dict[str, float]:
    run_id = uuid.uuid4().hex[:8]
    args = [backend, endpoint, run_id, "1" if torch else "0", str(warm)]
    out = subprocess.run(
        [sys.executable, "-c", NODE, *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _fmt(values: list[float]) -> str:
    ms = sorted(v * 1e3 for v in values)
    return f"{statistics.median(ms):.2f} ms ({ms[0]:.2f}-{ms[-1]:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--torch", action="store_true", help="import torch first")
    args = parser.parse_args(argv)
    server = Server()
    try:
        print(f"| store | first join | warm join | first / warm |  (torch: {args.torch})")
        print("|---|---|---|---|")
        for backend, endpoint in (("memory", ""), ("http", f"127.0.0.1:{server.port}")):
            got = [
                one_process(backend, endpoint, args.torch, args.warm) for _ in range(args.repeat)
            ]
            first, warm = [g["first"] for g in got], [g["warm"] for g in got]
            ratio = statistics.median(f / w for f, w in zip(first, warm, strict=True))
            print(f"| {backend} | {_fmt(first)} | {_fmt(warm)} | {ratio:.1f}x |", flush=True)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
