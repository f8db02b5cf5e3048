"""A torchrun user's elastic job, side by side with torch's c10d (prints figures; not a test).

``PYTHONPATH=. python benchmarks/lost_node.py [--trials N] [--timeout S] [--conf K=V,...]``

Each trial, for both launchers in turn (alternated in the same run), with their default settings:
a gloo all-reduce job of one worker per node, ``--nnodes 1:3 --max-restarts 3``, one OS process
per agent as a user would start them:

1. two nodes start and all-reduce at world size 2;
2. a third node starts: *join* is the time from its start to the first all-reduce at world 3;
3. the third node's agent is SIGKILLed (its host stays alive): *loss* is the time from the kill to
   the survivors' first all-reduce at world 2 (worker start-up and ``init_process_group``
   included).

aioelastic runs ``aioelastic run --rdzv-backend c10d`` against an ``aioelastic serve`` process;
torch runs ``torchrun --rdzv-backend c10d`` whose first node hosts the TCPStore (the node
killed is never that host). A step that does not happen within ``--timeout`` seconds is
reported as failed with what the launcher printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = """
import json, os, sys, time
import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
while True:
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    with open(out, "a") as f:
        f.write(json.dumps({"time": time.time(), "world": world, "sum": t.item()}) + "\\n")
    time.sleep(0.05)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env.pop("AIOELASTIC_EVENTS", None)
    return env


class Job:
    """One launcher's nodes, their log files and the workers' all-reduce records."""

    def __init__(self, side: str, work: Path, conf: str) -> None:
        self.side, self.work, self.conf = side, work, conf
        self.records = work / "allreduce.jsonl"
        self.worker = work / "worker.py"
        self.worker.write_text(WORKER)
        self.port = _free_port()
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.server: subprocess.Popen[bytes] | None = None
        if side == "aioelastic":
            self.server = subprocess.Popen(
                [sys.executable, "-m", "aioelastic", "serve", "--port", str(self.port)],
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=open(work / "serve.log", "wb"),  # noqa: SIM115
            )
            _wait_port(self.port, 20)

    def start_node(self) -> subprocess.Popen[bytes]:
        index = len(self.nodes)
        if self.side == "aioelastic":
            launcher = [sys.executable, "-m", "aioelastic", "run"]
        else:
            launcher = [sys.executable, "-m", "torch.distributed.run"]
        args = [
            *launcher,
            "--nnodes=1:3",
            "--nproc-per-node=1",
            "--max-restarts=3",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            "--rdzv-id=bench",
            "--local-addr=127.0.0.1",
        ]
        if self.conf:
            args.append(f"--rdzv-conf={self.conf}")
        log = open(self.work / f"node{index}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [*args, str(self.worker), str(self.records)],
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.nodes.append(proc)
        return proc

    def first_at(self, world: int, after: float, timeout: float) -> float | None:
        """Wall time of the first all-reduce at ``world`` after ``after``, or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                for line in self.records.read_text().splitlines():
                    rec = json.loads(line)
                    if rec["world"] == world and rec["time"] > after:
                        return float(rec["time"])
            time.sleep(0.02)  # a benchmark harness reading files, not the product
        return None

    def tail(self) -> str:
        logs = sorted(self.work.glob("node*.log"))
        return " | ".join(p.read_text(errors="replace").strip().splitlines()[-1:][0][-160:]
                          for p in logs if p.read_text().strip())  # fmt: skip

    def stop(self) -> None:
        for proc in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if self.server is not None:
            self.server.kill()
            self.server.wait()


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout}s")


def trial(side: str, timeout: float, conf: str) -> dict[str, float | str | None]:
    with tempfile.TemporaryDirectory(prefix=f"lost-node-{side}-") as tmp:
        job = Job(side, Path(tmp), conf)
        try:
            start = time.time()
            job.start_node()
            job.start_node()
            if job.first_at(2, start, timeout) is None:
                return {"join": None, "loss": None, "error": f"2 nodes never ran: {job.tail()}"}
            joined_at = time.time()
            third = job.start_node()
            seen = job.first_at(3, joined_at, timeout)
            if seen is None:
                return {"join": None, "loss": None, "error": f"third node: {job.tail()}"}
            time.sleep(0.5)  # a few all-reduces at world 3
            killed_at = time.time()
            third.send_signal(signal.SIGKILL)  # the agent only: its host lives
            back = job.first_at(2, killed_at, timeout)
            return {
                "join": seen - joined_at,
                "loss": None if back is None else back - killed_at,
                "error": None if back is not None else f"after the kill: {job.tail()}",
            }
        finally:
            job.stop()


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--conf", default="", help="--rdzv-conf for both launchers")
    parser.add_argument("--sides", default="aioelastic,torch")
    args = parser.parse_args()
    sides = args.sides.split(",")
    results: dict[str, list[dict[str, float | str | None]]] = {s: [] for s in sides}
    for n in range(args.trials):
        for side in sides if n % 2 == 0 else reversed(sides):  # alternate who goes first
            result = trial(side, args.timeout, args.conf)
            results[side].append(result)
            print(f"trial {n} {side}: {result}", flush=True)
    print(
        "\n| launcher | third node joins -> all-reduce at 3 | node SIGKILLed -> all-reduce at 2 |"
    )
    print("|---|---|---|")
    for side in sides:
        joins = [float(r["join"]) for r in results[side] if r["join"] is not None]
        losses = [float(r["loss"]) for r in results[side] if r["loss"] is not None]
        failed = sum(1 for r in results[side] if r["error"])
        note = f" ({failed} of {len(results[side])} trials failed)" if failed else ""
        print(f"| {side} | {_fmt(joins)} | {_fmt(losses)}{note} |")


if __name__ == "__main__":
    main()
