"""The first join of a process does no one-time work: it is done when the handler is created.

The host name (``socket.getfqdn()``, a DNS lookup that can block) is looked up in a thread when
the handler is created, never on the event loop inside the join; a registry creator also imports
what a join needs and opens the store's first connection, so a fresh process's first join
imports nothing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading

import pytest

from aioelastic.rendezvous import DynamicRendezvousHandler, StaticRendezvousHandler, _addr
from aioelastic.store import MemoryEngine, MemoryStore


@pytest.fixture
def looked_up_in(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Where ``socket.getfqdn`` runs (thread names), with a fresh lookup for this test."""
    threads: list[str] = []

    def getfqdn(name: str = "") -> str:
        threads.append(threading.current_thread().name)
        return "node.example"

    monkeypatch.setattr(socket, "getfqdn", getfqdn)
    monkeypatch.setattr(_addr, "_lookup", None)
    return threads


def test_the_host_name_is_looked_up_off_the_event_loop(looked_up_in: list[str]) -> None:
    async def main() -> tuple[str, str]:
        engine = MemoryEngine()
        dynamic = DynamicRendezvousHandler(MemoryStore(engine), "job", 1, 1)
        static = StaticRendezvousHandler(MemoryStore(engine), "static", 0, 1)
        got = await dynamic.next_rendezvous(), await static.next_rendezvous()
        await dynamic.aclose()
        await static.aclose()
        return got[0].bootstrap_store_info.master_addr, got[1].bootstrap_store_info.master_addr

    assert asyncio.run(main()) == ("node.example", "node.example")
    assert looked_up_in == ["aioelastic-getfqdn"]  # once per process, in its own thread


def test_a_given_address_looks_nothing_up(looked_up_in: list[str]) -> None:
    DynamicRendezvousHandler(MemoryStore(MemoryEngine()), "job", 1, 1, local_addr="10.0.0.1")
    assert looked_up_in == []


FIRST_JOIN = r"""
import asyncio, json, sys
from aioelastic.rendezvous import RendezvousParameters, create_handler

async def main():
    params = RendezvousParameters("memory", "", "job", 1, 1, last_call_timeout="0")
    handler = await create_handler(params)
    before = set(sys.modules)
    await handler.next_rendezvous()
    imported = sorted(set(sys.modules) - before)
    await handler.aclose()
    return imported

print(json.dumps(asyncio.run(main())))
"""


def test_a_fresh_process_first_join_imports_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FIRST_JOIN], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout) == []


def test_the_first_join_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """``benchmarks/first_join.py`` at the smallest size: a row per store, with its ratio."""
    from benchmarks.first_join import main

    assert main(["--repeat", "1", "--warm", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| memory", "| http"]
    assert all(row.endswith("x |") for row in rows[1:])
