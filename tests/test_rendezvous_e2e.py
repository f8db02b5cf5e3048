"""End to end: rendezvous nodes as separate processes over a real store (an ``aioelastic serve``
process, or a real etcd). One node is SIGKILLed; the survivors see it go at its lease expiry and
re-form a round without it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from helpers.http import ServerProcess

from aioelastic.etcd_server import EtcdServer

NODE = Path(__file__).resolve().parent / "rdzv_node.py"
TTL = 2.0


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    with ServerProcess() as server:
        yield server.url


@pytest.fixture(scope="module")
def etcd_url(etcd: EtcdServer) -> str:
    return etcd.url


class Node:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            kind, _, payload = raw.decode().partition(" ")
            if kind in ("ROUND", "EVENT"):
                await self.lines.put((kind, json.loads(payload)))

    async def next(self, kind: str, timeout: float = 60) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                got, payload = await self.lines.get()
                if got == kind:
                    return payload


async def spawn(url: str, run_id: str, n: int, lo: int, hi: int) -> list[Node]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    nodes = []
    for _ in range(n):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(NODE), url, run_id, str(lo), str(hi), str(TTL), "1.0",
            stdout=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
        )  # fmt: skip
        nodes.append(Node(proc))
    return nodes


async def settled_round(nodes: list[Node], size: int) -> list[dict[str, Any]]:
    """Each node's rounds until a round of ``size`` that all of them report last.

    Nodes need not report the same sequence of rounds: one that starts late (a loaded machine)
    may skip the first round the others formed without it.
    """
    latest: dict[int, dict[str, Any]] = {}
    reads = {asyncio.ensure_future(n.next("ROUND")): i for i, n in enumerate(nodes)}
    try:
        while True:
            done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
            for read in done:
                i = reads.pop(read)
                latest[i] = read.result()
                reads[asyncio.ensure_future(nodes[i].next("ROUND"))] = i
            rounds = [latest.get(i) for i in range(len(nodes))]
            if all(r is not None and r["world_size"] == size for r in rounds) and (
                len({r["round"] for r in rounds if r is not None}) == 1
            ):
                return [r for r in rounds if r is not None]
    finally:
        for read in reads:
            read.cancel()
        await asyncio.gather(*reads, return_exceptions=True)


async def scenario(url: str) -> None:
    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    nodes = await spawn(url, run_id, 3, 2, 3)
    try:
        first = await settled_round(nodes, 3)
        assert sorted(r["rank"] for r in first) == [0, 1, 2]
        assert len({tuple(r["participants"]) for r in first}) == 1
        victim = next(n for n, r in zip(nodes, first, strict=True) if r["rank"] == 1)
        victim_id = next(r["node"] for r in first if r["rank"] == 1)
        survivors = [n for n in nodes if n is not victim]
        killed_at = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        await victim.proc.wait()
        events = await asyncio.gather(*(n.next("EVENT") for n in survivors))
        seen_after = time.monotonic() - killed_at
        assert all(e["kind"] == "PARTICIPANT_LOST" and e["node"] == victim_id for e in events)
        assert seen_after <= TTL + 2.0  # within the TTL after the last keep-alive, plus slack
        second = await settled_round(survivors, 2)
        assert sorted(r["rank"] for r in second) == [0, 1]
        assert second[0]["participants"] == second[1]["participants"]
        assert victim_id not in second[0]["participants"]
        # rank 0 stayed; the old rank 2 took the free rank 1
        old = {r["node"]: r["rank"] for r in first}
        assert all(old[r["node"]] == 0 for r in second if r["rank"] == 0)
    finally:
        for node in nodes:
            if node.proc.returncode is None:
                node.proc.send_signal(signal.SIGKILL)
                await node.proc.wait()
            node.reader.cancel()
            await asyncio.gather(node.reader, return_exceptions=True)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_processes_over_http_survive_a_sigkill(http_url: str) -> None:
    await scenario(http_url)


@pytest.mark.etcd
@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_processes_over_etcd_survive_a_sigkill(etcd_url: str) -> None:
    await scenario(etcd_url)
