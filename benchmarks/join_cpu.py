"""Client CPU per warm rendezvous join in one process, alternated with another checkout.

    PYTHONPATH=. nice -n 5 python benchmarks/join_cpu.py [--joins 300] [--repeat 5]
        [--sizes 1,64] [--against /path/to/other/checkout]

Each round is a fresh process (this checkout's code, or ``--against``'s) that makes N dynamic
handlers over one memory store (``benchmarks.scale.make_handlers``: ``participants`` off, no
last call), warms them up with a few rounds, then times ``time.thread_time()`` over ``--joins``
joins (``--joins / N`` rounds of N) and prints the CPU per join, the event loop's callbacks per
join (``call_soon``: task steps, wake-ups, done-callbacks) and, over as many more rounds, the
function calls per join (Python and C, ``sys.setprofile``: a count the host's load does not
move). N = 1 is a round of one (the
driver); at larger N most joins are members'. Rounds alternate between the checkouts, so the
before/after figures come from one run on a loaded host: the table shows the median and range of
the rounds' figures, and the ratio of the medians.
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

NODE = r"""
import asyncio, json, sys, time
from aioelastic.store import MemoryEngine
from benchmarks.scale import make_handlers

n, joins = int(sys.argv[1]), int(sys.argv[2])


async def main() -> dict[str, float]:
    loop = asyncio.get_running_loop()
    handlers = make_handlers(MemoryEngine(), n, last_call_timeout=0)
    for _ in range(3):
        await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    rounds = max(1, joins // n)
    calls = 0
    call_soon = loop.call_soon

    def counting(*args, **kw):
        nonlocal calls
        calls += 1
        return call_soon(*args, **kw)

    loop.call_soon = counting
    cpu = time.thread_time()
    for _ in range(rounds):
        await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    cpu = time.thread_time() - cpu
    del loop.call_soon
    counted = 0

    def profile(frame, event, arg):
        nonlocal counted
        if event == "call" or event == "c_call":
            counted += 1

    sys.setprofile(profile)  # (after the timing: it slows every call)
    for _ in range(rounds):
        await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    sys.setprofile(None)
    await asyncio.gather(*(h.aclose() for h in handlers))
    per = rounds * n
    return {"cpu_us": cpu / per * 1e6, "callbacks": calls / per, "calls": counted / per}

print(json.dumps(asyncio.run(main())), flush=True)
"""


def one_round(code: Path, n: int, joins: int) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code)
    env.pop("AIOELASTIC_EVENTS", None)
    out = subprocess.run(
        [sys.executable, "-c", NODE, str(n), str(joins)],
        env=env,
        cwd=code,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _fmt(values: list[float], digits: int = 0) -> str:
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joins", type=int, default=300, help="timed joins per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per checkout and N")
    parser.add_argument("--sizes", default="1,64")
    parser.add_argument("--against", type=Path, help="another checkout, alternated (before)")
    args = parser.parse_args(argv)
    codes = [ROOT] + ([args.against.resolve()] if args.against else [])
    print("| N | checkout | client CPU per warm join, us | callbacks per join | calls per join |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        got: dict[Path, list[dict[str, float]]] = {code: [] for code in codes}
        for rep in range(args.repeat):
            for code in codes if rep % 2 == 0 else codes[::-1]:
                got[code].append(one_round(code, n, args.joins))
        for code in codes:
            cpu = [g["cpu_us"] for g in got[code]]
            callbacks = [g["callbacks"] for g in got[code]]
            calls = [g["calls"] for g in got[code]]
            print(
                f"| {n} | {code} | {_fmt(cpu)} | {_fmt(callbacks, 2)} | {_fmt(calls, 1)} |",
                flush=True,
            )
        if len(codes) > 1:
            ratio = statistics.median(g["cpu_us"] for g in got[codes[0]]) / statistics.median(
                g["cpu_us"] for g in got[codes[1]]
            )
            print(f"| {n} | ratio this / against (CPU medians) | {ratio:.3f} | | |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
