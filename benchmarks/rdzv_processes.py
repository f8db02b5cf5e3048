"""Rendezvous as torch runs it: one OS process per participant, handlers from torch's registry.

``PYTHONPATH=. python benchmarks/rdzv_processes.py [--sizes 2,4,8,16,32,64] [--repeat 3]
[--no-torch | --torch-only] [--warm K] [--node-logs DIR]``

For every N and repetition, torch's ``c10d`` backend and ``aioelastic`` (an ``aioelastic serve``
process as the store) are alternated, each with N fresh processes that create their handler with
``torch.distributed.elastic.rendezvous.registry.get_rendezvous_handler`` (backend ``c10d`` or
``aioelastic``, min = max = N), report ready, and call ``next_rendezvous()`` at one shared wall
time t0 (the same window for both sides). Figures:

- *round*: from t0 to the last process's return (median and range over the repetitions), and
  the ratio torch / aioelastic;
- *client CPU per join*: ``time.thread_time()`` of the joining thread plus the adapter's loop
  thread around ``next_rendezvous()`` (process CPU time, so both threads count), median over the
  processes of every repetition;
- *server CPU per join*: the ``aioelastic serve`` process's CPU time over the round divided by N.

Every process is fresh, so the first join of a process is what is measured (the adapter does its
one-time work when the handler is created). ``--no-torch`` runs the aioelastic rounds only (the
handlers still come from torch's registry; torch's c10d rounds and the ratio are skipped);
``--torch-only`` the c10d rounds only. ``--node-logs DIR``: each node's
``torch.distributed.elastic`` log at DEBUG in DIR (diagnosis; it costs the nodes CPU).

Each node is ``python -m benchmarks._rdzv_node`` (a module file, as torchrun's agent is a script):
under ``python -c`` torch's c10d handler spent 29 ms of CPU per recorded event in
``inspect.stack()``, and its N=64 round did not form (``benchmarks/_rdzv_node.py``).

``--warm K``: after that first (fresh) round, the same aioelastic processes join K more rounds,
each at a shared t0 of its own (every member rejoins; most members are not the driver), and a
second table gives the *warm* figures beside the fresh ones: the round, the client CPU per warm
join (median and range over every process's every warm join) and the server CPU per warm join.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.pop("AIOELASTIC_EVENTS", None)
    env["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    return env


def _cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` in ns resolution (/proc's schedstat; stat ticks at
    10 ms, too coarse for a round of a few nodes)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


class Server:
    """An ``aioelastic serve`` process on a free loopback port."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aioelastic", "serve", "--port", str(self.port)],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.05)
        raise RuntimeError("aioelastic serve did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def one_round(
    side: str,
    n: int,
    server: Server | None,
    timeout: float,
    warm: int = 0,
    logs: Path | None = None,
    round_timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """N fresh processes join one exact round at a shared t0, then ``warm`` more (each at a
    t0 of its own); returns the figures of each round, the fresh one first. ``logs``: a folder
    for each node's torch.distributed.elastic debug log."""
    if side == "aioelastic":
        assert server is not None
        backend, endpoint = "aioelastic", f"http://127.0.0.1:{server.port}"
    else:
        backend, endpoint = "c10d", f"127.0.0.1:{_free_port()}"
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    errors = [tempfile.TemporaryFile("w+") for _ in range(n)]  # noqa: SIM115 (closed below)
    # from a module file, as torchrun's agent runs (see _rdzv_node's docstring: not ``-c``)
    node = [sys.executable, "-m", "benchmarks._rdzv_node", backend, endpoint, run_id, str(n)]
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen(
            node + ([str(logs / f"{side}-{n}-{run_id}-{i:02d}.log")] if logs else []),
            env=_env(),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        for i, err in enumerate(errors)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{side} node did not get ready: {line!r}")
        rounds = [
            _a_round(side, n, procs, errors, server, timeout, round_timeout)
            for _ in range(1 + warm)
        ]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
        return rounds
    finally:
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for err in errors:
            err.close()


def _a_round(
    side: str,
    n: int,
    procs: list[subprocess.Popen[str]],
    errors: list[Any],
    server: Server | None,
    timeout: float,
    round_timeout: float,
) -> dict[str, Any]:
    """One round of the ready processes ``procs`` at a shared t0: its figures. A round that has
    not formed ``round_timeout`` seconds after t0 is a failure: every node is killed."""
    t0 = time.time() + 0.5
    server_cpu = _cpu_seconds(server.proc.pid) if server is not None else 0.0
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{t0}\n")
        proc.stdin.flush()
    results = []
    for proc, err in zip(procs, errors, strict=True):
        assert proc.stdout is not None
        # each node writes one line per round, so nothing is left in the pipe's buffer here
        if not select.select([proc.stdout], [], [], max(0.0, t0 + round_timeout - time.time()))[0]:
            for each in procs:
                each.kill()
            raise RoundFailed(f"{side} N={n}: no round within {round_timeout:g} s of t0")
        line = proc.stdout.readline()
        if not line.strip():  # the node died: say why, as the round's failure
            proc.wait(timeout)
            err.seek(0)
            last = (err.read().strip().splitlines() or ["(no output)"])[-1]
            raise RoundFailed(f"{side} N={n}: a node exited {proc.returncode}: {last[:200]}")
        results.append(json.loads(line))
    server_cpu = (_cpu_seconds(server.proc.pid) - server_cpu) if server is not None else 0.0
    ranks = sorted(r["rank"] for r in results)
    if ranks != list(range(n)):
        raise RuntimeError(f"{side}: ranks {ranks}")
    return {
        "round": max(r["done"] for r in results) - t0,
        "cpu": statistics.median(r["cpu"] for r in results),
        "cpus": [r["cpu"] for r in results],
        "server_cpu_per_join": server_cpu / n,
    }


class RoundFailed(Exception):
    """A round that did not form: a node died or was refused (reported, not hidden)."""


def _fmt(values: list[float], scale: float = 1.0, unit: str = "s") -> str:
    med = statistics.median(values) * scale
    return f"{med:.3g} {unit} ({min(values) * scale:.3g}-{max(values) * scale:.3g})"


def _warm_row(n: int, warm: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> str:
    cpus = [cpu for g in warm for cpu in g["cpus"]]
    fresh_cpus = [cpu for g in fresh for cpu in g["cpus"]]
    return (
        f"| {n} | {len(warm)} | {_fmt([g['round'] for g in warm], 1000, 'ms')} | "
        f"{_fmt(cpus, 1000, 'ms')} | {_fmt(fresh_cpus, 1000, 'ms')} | "
        f"{_fmt([g['server_cpu_per_join'] for g in warm], 1e6, 'us')} |"
    )


def _row(n: int, got: dict[str, list[dict[str, Any]]], no_torch: bool) -> str | None:
    """The main table's row of N (None when no round of either side formed)."""
    if not got["aioelastic"]:
        if not got["torch"]:
            return None
        # --torch-only: torch's round and its nodes' CPU per join in the client column
        t = [g["round"] for g in got["torch"]]
        cpu = [g["cpu"] for g in got["torch"]]
        cpu_col = f"torch {_fmt(cpu, 1000, 'ms')}"
        return f"| {n} | {_fmt(t)} | (not run) | (--torch-only) | {cpu_col} | - |"
    a = [g["round"] for g in got["aioelastic"]]
    torch_round, ratio = "(not run)", "(--no-torch)"
    if not no_torch and not got["torch"]:
        # every torch round failed (listed above): aioelastic's figures all the same
        torch_round, ratio = "(failed)", "(none)"
    elif not no_torch:
        t = [g["round"] for g in got["torch"]]
        ratios = [x / y for x, y in zip(t, a, strict=False)]
        torch_round = _fmt(t)
        ratio = f"{statistics.median(ratios):.1f}x (min {min(ratios):.1f}x)"
    return (
        f"| {n} | {torch_round} | {_fmt(a, 1000, 'ms')} | {ratio} | "
        f"{_fmt([g['cpu'] for g in got['aioelastic']], 1000, 'ms')} | "
        f"{_fmt([g['server_cpu_per_join'] for g in got['aioelastic']], 1e6, 'us')} |"
    )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8,16,32,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument(
        "--round-timeout",
        type=float,
        default=300.0,
        help="seconds after t0 before a round that has not formed is failed and its nodes killed "
        "(default: 300; torch's nodes would wait out its 600 s join timeout)",
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument(
        "--no-torch", action="store_true", help="aioelastic rounds only (no c10d side)"
    )
    only.add_argument(
        "--torch-only", action="store_true", help="torch c10d rounds only (no aioelastic side)"
    )
    parser.add_argument(
        "--node-logs",
        type=Path,
        default=None,
        help="a folder for each node's torch.distributed.elastic DEBUG log (diagnosis only)",
    )
    parser.add_argument(
        "--warm", type=int, default=0, help="warm aioelastic rounds after the fresh one"
    )
    return parser.parse_args()


def main() -> None:
    args = _parse()
    sides = ["torch", "aioelastic"]
    if args.no_torch or args.torch_only:
        sides = ["aioelastic"] if args.no_torch else ["torch"]
    sizes = [int(x) for x in args.sizes.split(",")]
    server = Server()
    rows, warm_rows = [], []
    try:
        for n in sizes:
            got: dict[str, list[dict[str, Any]]] = {"torch": [], "aioelastic": []}
            warm: list[dict[str, Any]] = []
            failed: list[str] = []
            for rep in range(args.repeat):
                order = sides if rep % 2 == 0 else sides[::-1]
                for side in order:
                    aio = side != "torch"
                    try:
                        first, *more = one_round(
                            side,
                            n,
                            server if aio else None,
                            args.timeout,
                            args.warm if aio else 0,
                            args.node_logs,
                            args.round_timeout,
                        )
                    except RoundFailed as exc:
                        failed.append(str(exc))
                        print(f"failed: {exc}", flush=True)
                        continue
                    got[side].append(first)
                    warm += more
            if failed:
                rows.append(f"| {n} | {len(failed)} round(s) failed: {'; '.join(failed)[:300]} |")
                print(rows[-1], flush=True)
            if warm:
                warm_rows.append(_warm_row(n, warm, got["aioelastic"]))
                print(warm_rows[-1], flush=True)
            row = _row(n, got, args.no_torch)
            if row is None:
                continue
            rows.append(row)
            print(row, flush=True)
    finally:
        server.close()
    print("\n| N | torch c10d round | aioelastic round | ratio (per repetition) | "
          "aioelastic client CPU per join | server CPU per join |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    if warm_rows:
        print("\n| N | warm rounds | warm round | client CPU per warm join | "
              "client CPU per fresh join | server CPU per warm join |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for row in warm_rows:
            print(row)


if __name__ == "__main__":
    main()
