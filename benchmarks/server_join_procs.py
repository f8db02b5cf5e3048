"""Server CPU per rendezvous join over rounds of N separate processes, with what it paid for.

An ``aioelastic serve`` process and N light node processes (no torch: each opens an
``http://`` store and a :class:`~aioelastic.rendezvous.DynamicRendezvousHandler`, min = max =
N) join a first round and ``--warm`` more, each at a shared t0. For every round it prints the
server process's CPU over the round divided by N (every thread, from ``/proc``'s schedstat, as
``benchmarks/rdzv_processes.py`` measures it) and, per join, the server's write and read system
calls (``/proc/PID/io``'s ``syscw`` and ``syscr``: each write to a sleeping node's socket wakes
it, which is most of the server's CPU) and its session operations by name (``/metrics``, read
between rounds). ``--against DIR`` alternates with the server of another checkout (its nodes
too) in the same run: same-run before/after, the ratio per pair of rounds.

    PYTHONPATH=. nice -n 5 python -m benchmarks.server_join_procs --n 64 --warm 5 --repeat 2 \
        [--against /path/to/other/checkout]

``--py-spy FILE`` records the server with py-spy (if installed) over the warm rounds of the
first repetition, as collapsed stacks (``-f raw``; on-CPU samples only). ``--profile FILE``
runs that server under cProfile instead (on over its warm rounds only: SIGUSR1 starts it,
SIGUSR2 writes FILE) and prints its top functions by own time per join; cProfile slows what it
measures (its figures are for where the time goes, not for how much there is).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.rdzv_processes import _cpu_seconds
from benchmarks.scale_http import serve_process

ROOT = Path(__file__).resolve().parents[1]

NODE = r"""
import asyncio, json, sys, time
import aioelastic
from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.store import open_store

async def main():
    url, run_id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = await open_store(url)
    handler = DynamicRendezvousHandler(
        store, run_id, n, n, local_addr="127.0.0.1", lease_ttl=15.0, owns_store=True
    )
    loop = asyncio.get_running_loop()
    print("ready", aioelastic.__file__, flush=True)
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        await asyncio.sleep(max(0.0, float(line) - time.time()))
        info = await handler.next_rendezvous()
        print(json.dumps({"rank": info.rank}), flush=True)
    await handler.aclose()

asyncio.run(main())
"""


#: ``aioelastic`` under cProfile, off until SIGUSR1; SIGUSR2 stops it and writes argv[1]
PROFILED = r"""
import cProfile, signal, sys, time
from aioelastic.cli import main
out, profile = sys.argv[1], cProfile.Profile(time.process_time)
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, lambda *_: (profile.disable(), profile.dump_stats(out)))
sys.exit(main(sys.argv[2:]))
"""


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONUNBUFFERED="1")
    env.pop("AIOELASTIC_EVENTS", None)
    return env


def _syscalls(pid: int) -> tuple[int, int]:
    """(write, read) system calls of ``pid`` so far."""
    fields = dict(
        line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines() if line
    )
    return int(fields["syscw"]), int(fields["syscr"])


def _user_system(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` so far (clock ticks: sum many rounds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _ops(url: str) -> dict[str, int]:
    """Session and REST operations answered so far, by op (the server's /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    ops: dict[str, int] = {}
    for match in re.finditer(
        r'^aioelastic_requests_total\{code="\d+",op="(\w+)"\} (\S+)', text, re.M
    ):
        ops[match[1]] = ops.get(match[1], 0) + int(float(match[2]))
    return ops


@contextlib.contextmanager
def _nodes(root: Path, url: str, n: int) -> Iterator[list[subprocess.Popen[str]]]:
    run_id = f"procs-{uuid.uuid4().hex[:8]}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NODE, url, run_id, str(n)],
            env=_env(root),
            cwd=root,  # (python -c puts its working directory first on the path)
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            word, _, where = proc.stdout.readline().strip().partition(" ")
            if word != "ready":
                raise RuntimeError("a node did not get ready")
            if not Path(where).resolve().is_relative_to(root.resolve()):
                raise RuntimeError(f"a node of {root} runs the aioelastic of {where}")
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.write("\n")
                proc.stdin.flush()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _round(pid: int, url: str, procs: list[subprocess.Popen[str]]) -> dict[str, Any]:
    """One round at a shared t0: the server's CPU, system calls and operations per join."""
    n = len(procs)
    ops_before = _ops(url)
    time.sleep(0.3)  # the scrape's own work is done before the window opens
    t0 = time.time() + 0.5
    cpu, (writes, reads), (user, system) = _cpu_seconds(pid), _syscalls(pid), _user_system(pid)
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{t0}\n")
        proc.stdin.flush()
    ranks = []
    for proc in procs:
        assert proc.stdout is not None
        ranks.append(json.loads(proc.stdout.readline())["rank"])
    cpu, (w2, r2), (u2, s2) = _cpu_seconds(pid) - cpu, _syscalls(pid), _user_system(pid)
    if sorted(ranks) != list(range(n)):
        raise RuntimeError(f"ranks {sorted(ranks)}")
    ops = _ops(url)
    return {
        "cpu": cpu / n,
        "writes": (w2 - writes) / n,
        "reads": (r2 - reads) / n,
        "user": u2 - user,
        "system": s2 - system,
        "ops": {
            op: (ops[op] - ops_before.get(op, 0)) / n
            for op in ops
            if op not in ("metrics", "other") and ops[op] > ops_before.get(op, 0)
        },
    }


def run_side(
    root: Path, n: int, warm: int, spy: str | None, profile: str | None = None
) -> list[dict[str, Any]]:
    """A server of checkout ``root`` and N nodes of it: the first round, then ``warm`` more."""
    command = None if profile is None else [sys.executable, "-c", PROFILED, profile]
    with (
        serve_process([], _env(root), cwd=root, command=command) as (proc, url, _),
        _nodes(root, url, n) as nodes,
    ):
        rounds = [_round(proc.pid, url, nodes)]
        if profile is not None:
            proc.send_signal(signal.SIGUSR1)
            rounds += [_round(proc.pid, url, nodes) for _ in range(warm)]
            proc.send_signal(signal.SIGUSR2)
            _wait_for(Path(profile))
            _print_profile(profile, n * warm)
            return rounds
        recorder = None
        if spy is not None:
            recorder = subprocess.Popen(
                ["py-spy", "record", "-p", str(proc.pid), "-r", "1000", "-f", "raw", "-o", spy,
                 "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)
        try:
            rounds += [_round(proc.pid, url, nodes) for _ in range(warm)]
        finally:
            if recorder is not None:
                recorder.send_signal(2)
                recorder.wait(60)
        return rounds


def _wait_for(path: Path) -> None:
    for _ in range(300):  # (written by the server's signal handler, soon)
        if path.exists() and path.stat().st_size:
            time.sleep(0.2)
            return
        time.sleep(0.1)
    raise RuntimeError(f"the server wrote no profile to {path}")


def _print_profile(path: str, joins: int, top: int = 30) -> None:
    """The profile's top functions by own time, in microseconds per join."""
    stats = pstats.Stats(path)
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)  # type: ignore[attr-defined]
    total = sum(row[1][2] for row in rows)
    print(f"\nserver profile, warm rounds ({joins} joins): {total / joins * 1e6:.0f} us per join")
    print("| own us / join | calls / join | function |")
    print("|---|---|---|")
    for (file, line, name), (_, calls, own, _, _) in rows[:top]:
        where = f"{Path(file).name}:{line}" if line else file
        print(f"| {own / joins * 1e6:.1f} | {calls / joins:.2f} | {name} ({where}) |")


def _fmt(values: list[float], scale: float, digits: int = 0) -> str:
    med = statistics.median(values) * scale
    return f"{med:.{digits}f} ({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"


def _report(label: str, rounds: list[list[dict[str, Any]]]) -> None:
    fresh = [side[0] for side in rounds]
    warm = [r for side in rounds for r in side[1:]]
    print(f"\n{label}")
    print("| rounds | server CPU / join (us) | writes / join | reads / join | ops / join |")
    print("|---|---|---|---|---|")
    for name, group in (("fresh", fresh), ("warm", warm)):
        if not group:
            continue
        ops: dict[str, list[float]] = {}
        for r in group:
            for op, count in r["ops"].items():
                ops.setdefault(op, []).append(count)
        # (an op missing from a round counts 0 there)
        per_op = ", ".join(
            f"{op} {statistics.median(c + [0.0] * (len(group) - len(c))):.2f}"
            for op, c in sorted(ops.items())
        )
        print(
            f"| {name} ({len(group)}) | {_fmt([r['cpu'] for r in group], 1e6)} | "
            f"{_fmt([r['writes'] for r in group], 1, 2)} | "
            f"{_fmt([r['reads'] for r in group], 1, 2)} | {per_op} |"
        )
    user, system = sum(r["user"] for r in warm), sum(r["system"] for r in warm)
    if user + system:
        print(
            f"warm rounds' server CPU in the kernel (system time, clock ticks summed over "
            f"{len(warm)} rounds): {system / (user + system):.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64, help="node processes per round")
    parser.add_argument("--warm", type=int, default=5, help="warm rounds after the first")
    parser.add_argument("--repeat", type=int, default=2, help="fresh sets of processes")
    parser.add_argument("--against", type=Path, help="another checkout, alternated with this")
    parser.add_argument("--py-spy", dest="spy", help="py-spy the first repetition's warm rounds")
    parser.add_argument(
        "--profile", help="cProfile this checkout's server over its first warm rounds to FILE"
    )
    args = parser.parse_args()
    sides = [ROOT] + ([args.against.resolve()] if args.against else [])
    got: dict[Path, list[list[dict[str, Any]]]] = {side: [] for side in sides}
    for rep in range(args.repeat):
        for side in sides if rep % 2 == 0 else sides[::-1]:
            first = rep == 0 and side == ROOT
            spy, profile = (args.spy, args.profile) if first else (None, None)
            got[side].append(run_side(side, args.n, args.warm, spy, profile))
            last = got[side][-1]
            print(
                f"{side}: N={args.n} server CPU per join: first {last[0]['cpu'] * 1e6:.0f} us, "
                f"warm {[round(r['cpu'] * 1e6) for r in last[1:]]}",
                flush=True,
            )
    for side in sides:
        _report(f"{side} (N={args.n})", got[side])
    if args.against:
        pairs = [
            a["cpu"] / b["cpu"]
            for ra, rb in zip(got[ROOT], got[sides[1]], strict=True)
            for a, b in zip(ra[1:], rb[1:], strict=True)
        ]
        print(
            f"\nwarm server CPU per join, this / {sides[1]}: median {statistics.median(pairs):.2f} "
            f"({min(pairs):.2f}-{max(pairs):.2f}, {len(pairs)} pairs of rounds)"
        )


if __name__ == "__main__":
    main()
