"""A thousand sessions against one real ``aioelastic serve`` (127.0.0.1), spread over client
processes and all connecting at once: every session is served (its own write lands), and one put
reaches all 1,000 watches, at the same revision. Bounded in time, generously (CI, a loaded
machine); the figures at 10,000 are the benchmark's (``benchmarks/scale.py --mode http``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import aiohttp
import pytest
from helpers.http import ROOT, ServerProcess

from aioelastic.store import open_store

PROCESSES = 4
PER_PROCESS = 250
#: Generous: set-up, the storm of 1,000 connections, one put, on a shared 2-core machine.
BOUND = 120.0

#: A client process: PER_PROCESS sessions, each writes its own key and starts a watch; READY;
#: then, told to, waits for the first event of every watch and says at which revisions.
CLIENT = """
import asyncio, json, sys
from aioelastic.store import open_store

async def main(url: str, first: int, count: int) -> None:
    stores = [await open_store(url) for _ in range(count)]
    await asyncio.gather(*(s.put(f"s/{first + i}", b"x") for i, s in enumerate(stores)))
    watches = [s.watch("w/") for s in stores]
    await asyncio.gather(*(w.start() for w in watches))
    retries = sum(s.session.connect_retries for s in stores)
    print("READY", json.dumps({"retries": retries}), flush=True)
    firsts = await asyncio.gather(*(anext(w) for w in watches))
    print("GOT", json.dumps(sorted({(e.kv.key, e.revision) for e in firsts})), flush=True)
    for w in watches:
        await w.aclose()
    await asyncio.gather(*(s.aclose() for s in stores))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


async def _line(proc: asyncio.subprocess.Process) -> tuple[str, object]:
    assert proc.stdout is not None
    raw = (await proc.stdout.readline()).decode().strip()
    kind, _, rest = raw.partition(" ")
    assert kind in ("READY", "GOT"), raw[:500]
    return kind, json.loads(rest)


async def _sessions(url: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    line = next(x for x in text.splitlines() if x.startswith("aioelastic_sessions "))
    return float(line.split()[1])


@pytest.mark.asyncio
async def test_a_thousand_sessions_with_watches_are_served_and_one_put_reaches_them_all() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with ServerProcess() as server:
        started = time.monotonic()
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                CLIENT,
                server.url,
                str(i * PER_PROCESS),
                str(PER_PROCESS),
                env=env,
                stdout=asyncio.subprocess.PIPE,
            )
            for i in range(PROCESSES)
        ]
        try:
            async with asyncio.timeout(BOUND):
                ready = [await _line(p) for p in procs]
                assert all(kind == "READY" for kind, _ in ready)
                assert await _sessions(server.url) == PROCESSES * PER_PROCESS
                async with open_store(server.url) as store:
                    written = await store.range("s/")
                    assert written.count == PROCESSES * PER_PROCESS  # every session was served
                    revision = await store.put("w/go", b"1")
                got = [await _line(p) for p in procs]
                # every watch of every process got the put as its first event
                assert all(value == [["w/go", revision]] for _, value in got), got
                for proc in procs:
                    assert await proc.wait() == 0
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        assert time.monotonic() - started < BOUND
