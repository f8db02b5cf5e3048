"""Client CPU per warm rendezvous join in one process, alternated with another checkout.

    PYTHONPATH=. nice -n 5 python benchmarks/join_cpu.py [--joins 300] [--repeat 5]
        [--sizes 1,64] [--store memory|http|adapter] [--against /path/to/other/checkout]
        [--instructions]

Each round is a fresh process (this checkout's code, or ``--against``'s) that makes N dynamic
handlers over one store, warms them up with a few rounds, then times ``time.thread_time()`` over
``--joins`` joins (``--joins / N`` rounds of N) and prints the CPU per join, the event loop's
callbacks per join (``call_soon``: task steps, wake-ups, done-callbacks) and, over as many more
rounds, the function calls per join (Python and C, ``sys.setprofile``: a count the host's load
does not move). N = 1 is a round of one (the driver); at larger N most joins are members'.

``--store``: ``memory`` (one memory store engine; ``benchmarks.scale.make_handlers``:
``participants`` off, no last call), ``http`` (one ``aioelastic serve`` process for the whole
run, a store client and session per handler, as one process per participant has), or
``adapter``: torchrun's layout, a round of one through torch's registry (``backend="aioelastic"``,
the adapter's loop thread, uvloop when installed): ``time.process_time()`` per warm
``next_rendezvous()`` (both threads; no callback or call counts, which uvloop does not expose;
``--sizes`` is ignored). Rounds alternate between the checkouts, so the before/after figures
come from one run on a loaded host: the table shows the median and range of the rounds'
figures, and the ratio of the medians.

``--instructions`` (``memory`` or ``http``): the client process's instructions per warm join,
counted by ``valgrind --tool=callgrind`` (the same figure for the same code whatever the host's
load; the server, a process of its own, is not counted). Each checkout's node runs twice under
callgrind, with no timed rounds and with ``--joins / N``, and the difference of the two counts
divided by those joins is the figure (start-up, imports, the warm-up and the close cancel out).
About a minute per checkout and N; ``--repeat`` runs each pair that many times (default 1 here).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NODE = r"""
import asyncio, json, sys, time, uuid
from aioelastic.store import MemoryEngine
from benchmarks.scale import make_handlers

n, joins, url = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
#: --instructions: this many rounds after the warm-up, nothing timed or counted in Python
plain = int(sys.argv[4]) if len(sys.argv) > 4 else -1


def http_handlers():
    from aioelastic.rendezvous import DynamicRendezvousHandler
    from aioelastic.store.http import HttpStore

    run = uuid.uuid4().hex[:8]
    return [
        DynamicRendezvousHandler(
            HttpStore(url), run, n, n, local_addr="127.0.0.1", owns_store=True,
            participants=False, last_call_timeout=0,
        )
        for _ in range(n)
    ]


async def main() -> dict[str, float]:
    loop = asyncio.get_running_loop()
    if url:
        handlers = http_handlers()
    else:
        handlers = make_handlers(MemoryEngine(), n, last_call_timeout=0)
    for _ in range(3):
        await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    if plain >= 0:  # (callgrind counts the process: the difference of two round counts)
        for _ in range(plain):
            await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        await asyncio.gather(*(h.aclose() for h in handlers))
        return {}
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


ADAPTER = r"""
import json, sys, time, uuid
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from aioelastic.torchrun import register

register()
joins, url = int(sys.argv[1]), sys.argv[2]
params = RendezvousParameters(
    "aioelastic", url, uuid.uuid4().hex[:8], 1, 1, join_timeout="120", last_call_timeout="0"
)
handler = get_rendezvous_handler(params)
for _ in range(10):
    handler.next_rendezvous()
cpu = time.process_time()
for _ in range(joins):
    handler.next_rendezvous()
cpu = time.process_time() - cpu
handler.shutdown()
print(json.dumps({"cpu_us": cpu / joins * 1e6, "callbacks": 0.0, "calls": 0.0}), flush=True)
"""


def one_round(
    code: Path, n: int, joins: int, store: str = "memory", url: str = ""
) -> dict[str, float]:
    if store == "adapter":
        argv = ["-c", ADAPTER, str(joins), url]
    else:
        argv = ["-c", NODE, str(n), str(joins), url if store == "http" else ""]
    out = _run(code, [sys.executable, *argv])
    if out.returncode != 0:  # say why (the node's last lines), not only that it failed
        tail = "\n".join(out.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{code} N={n} ({store}): exit {out.returncode}:\n{tail}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _run(code: Path, command: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONHASHSEED="0")
    env.pop("AIOELASTIC_EVENTS", None)
    return subprocess.run(
        command,
        env=env,
        cwd=code,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def instructions(code: Path, n: int, joins: int, url: str) -> float:
    """callgrind's count of the client process's instructions per warm join of ``code``'s
    node: two runs, with 0 and ``joins // n`` rounds after the warm-up, subtracted."""
    rounds = max(1, joins // n)
    counts = []
    for extra in (0, rounds):
        with tempfile.NamedTemporaryFile(suffix=".callgrind") as out:
            argv = ["-c", NODE, str(n), "0", url, str(extra)]
            grind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}"]
            done = _run(code, [*grind, sys.executable, *argv])
        match = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode or match is None:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise RuntimeError(f"{code} N={n} under callgrind: exit {done.returncode}:\n{tail}")
        counts.append(int(match[1]))
    return (counts[1] - counts[0]) / (rounds * n)


def _fmt(values: list[float], digits: int = 0) -> str:
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joins", type=int, default=300, help="timed joins per round")
    parser.add_argument(
        "--repeat", type=int, help="rounds per checkout and N (5; with --instructions 1)"
    )
    parser.add_argument("--sizes", default="1,64")
    parser.add_argument("--store", choices=("memory", "http", "adapter"), default="memory")
    parser.add_argument("--against", type=Path, help="another checkout, alternated (before)")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions with callgrind"
    )
    args = parser.parse_args(argv)
    if args.instructions and args.store == "adapter":
        parser.error("--instructions counts --store memory or http")
    if args.repeat is None:
        args.repeat = 1 if args.instructions else 5
    codes = [ROOT] + ([args.against.resolve()] if args.against else [])
    server = None
    if args.store != "memory":
        if str(ROOT) not in sys.path:  # (run as a script, benchmarks/ is not importable)
            sys.path.insert(0, str(ROOT))
        from benchmarks.rdzv_processes import Server

        server = Server()
    try:
        url = "" if server is None else f"http://127.0.0.1:{server.port}"
        if args.instructions:
            return _instructions_table(args, codes, url)
        return _table(args, codes, url)
    finally:
        if server is not None:
            server.close()


def _table(args: argparse.Namespace, codes: list[Path], url: str) -> int:
    sizes = "1" if args.store == "adapter" else args.sizes
    print(f"store: {args.store}")
    print("| N | checkout | client CPU per warm join, us | callbacks per join | calls per join |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in sizes.split(",")):
        got: dict[Path, list[dict[str, float]]] = {code: [] for code in codes}
        for rep in range(args.repeat):
            for code in codes if rep % 2 == 0 else codes[::-1]:
                got[code].append(one_round(code, n, args.joins, args.store, url))
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


def _instructions_table(args: argparse.Namespace, codes: list[Path], url: str) -> int:
    print(f"store: {args.store}, callgrind, {args.joins} joins")
    print("| N | checkout | client instructions per warm join |")
    print("|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        got: dict[Path, list[float]] = {code: [] for code in codes}
        for rep in range(args.repeat):
            for code in codes if rep % 2 == 0 else codes[::-1]:
                got[code].append(instructions(code, n, args.joins, url))
        for code in codes:
            counts = got[code]
            print(f"| {n} | {code} | {_fmt(counts)} |", flush=True)
        if len(codes) > 1:
            ratio = statistics.median(got[codes[0]]) / statistics.median(got[codes[1]])
            print(f"| {n} | ratio this / against | {ratio:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
