"""How fast the elastic agent restarts a failed worker group (prints figures; not a test).

``PYTHONPATH=. python benchmarks/agent.py [--trials N] [--nproc P]``

Two set-ups, each failing ``N`` times in a row (rank 1 exits 1 right after it starts):

- **one node**: one :class:`~aioelastic.agent.ElasticAgent` (``--standalone``'s set-up);
- **two nodes**: two agents in this process rendezvousing over an in-process HTTP store on
  loopback: the failing node re-registers, the other sees ``NODES_WAITING`` and follows.

Figures per restart:

- *agent*: the agent's own measure, from seeing the failure to the new workers spawned
  (``RunResult.restart_latencies``), stopping the rest of the group (SIGTERM) included;
- *end to end*: from the failing worker's last wall-clock stamp before ``exit(1)`` to the last
  worker of the new group having started its Python interpreter and written its first line
  (so the ~30-60 ms interpreter start-up is included).

There is no grace or last-call wait here: the healthy workers die at SIGTERM and the rounds are
complete when ``max_nodes`` have joined, so these are the agent's own costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

from aioelastic.agent import ElasticAgent, WorkerSpec
from aioelastic.rendezvous import RendezvousParameters
from aioelastic.store.http.server import HttpStoreServer

ROOT = Path(__file__).resolve().parents[1]

WORKER = """
import json, os, sys, time
stamp = time.time()
out, trials = sys.argv[1], int(sys.argv[2])
rnd = int(os.environ["AIOELASTIC_ROUND"])
with open(os.path.join(out, "starts.jsonl"), "a") as f:
    f.write(json.dumps({"round": rnd, "rank": os.environ["RANK"], "time": stamp}) + "\\n")
if rnd < trials:
    if os.environ["RANK"] == "1":
        with open(os.path.join(out, "fails.jsonl"), "a") as f:
            f.write(json.dumps({"round": rnd, "time": time.time()}) + "\\n")
        sys.exit(1)
    time.sleep(60)  # stopped by the agent (SIGTERM)
"""


def _figures(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    if not ms:
        return f"{name}: no data"
    return (
        f"{name}: n={len(ms)} p50 {statistics.median(ms):.1f} ms, "
        f"mean {statistics.fmean(ms):.1f} ms, max {ms[-1]:.1f} ms"
    )


def _end_to_end(out: Path, trials: int) -> list[float]:
    starts = [json.loads(x) for x in (out / "starts.jsonl").read_text().splitlines()]
    fails = [json.loads(x) for x in (out / "fails.jsonl").read_text().splitlines()]
    result = []
    for fail in fails:
        nxt = [s["time"] for s in starts if s["round"] > fail["round"]]
        if nxt:
            first_round = min(s["round"] for s in starts if s["round"] > fail["round"])
            group = [s["time"] for s in starts if s["round"] == first_round]
            result.append(max(group) - fail["time"])
    return result[:trials]


async def one_node(trials: int, nproc: int, tmp: Path) -> None:
    out = tmp / "one"
    out.mkdir()
    script = tmp / "worker.py"
    spec = WorkerSpec(
        entrypoint=[sys.executable, str(script), str(out), str(trials)],
        nproc_per_node=nproc,
        max_restarts=trials,
        stop_timeout=5,
        env={"PYTHONPATH": str(ROOT)},
    )
    params = RendezvousParameters("memory", "bench-one", "bench-one", 1, 1, last_call_timeout=0)
    async with ElasticAgent(spec, params) as agent:
        result = await agent.run()
    assert result.exit_code == 0, result.summary()
    print(f"one node, {nproc} workers, {trials} failures:")
    print(
        "  "
        + _figures("agent (failure seen -> new workers spawned)", list(result.restart_latencies))
    )
    print(
        "  " + _figures("end to end (exit(1) -> whole new group started)", _end_to_end(out, trials))
    )


async def two_nodes(trials: int, nproc: int, tmp: Path) -> None:
    out = tmp / "two"
    out.mkdir()
    script = tmp / "worker.py"
    async with HttpStoreServer(port=0) as server:

        def agent() -> ElasticAgent:
            spec = WorkerSpec(
                entrypoint=[sys.executable, str(script), str(out), str(trials)],
                nproc_per_node=nproc,
                max_restarts=trials,
                stop_timeout=5,
                env={"PYTHONPATH": str(ROOT)},
            )
            params = RendezvousParameters(
                "c10d", f"127.0.0.1:{server.port}", "bench-two", 2, 2, local_addr="127.0.0.1"
            )
            return ElasticAgent(spec, params)

        async with agent() as a, agent() as b:
            results = await asyncio.gather(a.run(), b.run())
    for result in results:
        assert result.exit_code == 0, result.summary()
    print(f"two nodes over the HTTP store, {nproc} workers each, {trials} failures:")
    for node, result in enumerate(results):
        what = f"agent of node {node} ({result.restarts} own failures, {result.rounds} rounds)"
        print("  " + _figures(what, list(result.restart_latencies)))
    print(
        "  " + _figures("end to end (exit(1) -> whole new group started)", _end_to_end(out, trials))
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("aioelastic").setLevel(logging.CRITICAL)  # the figures only
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "worker.py").write_text(WORKER)
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        await one_node(args.trials, args.nproc, tmp)
        await two_nodes(args.trials, args.nproc, tmp)


if __name__ == "__main__":
    asyncio.run(main())
