"""``read_run_status`` on the memory store in virtual time, and ``aioelastic status`` end to end.

The snapshot tests form real rounds with ``DynamicRendezvousHandler``s sharing one
``MemoryEngine`` on the virtual-time loop, so lease times left are exact. The CLI tests run
``python -m aioelastic status`` as a subprocess against a real HTTP store server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from helpers import ROOT, settle, subprocess_env

from aioelastic.errors import RendezvousNotFoundError, RendezvousStateError
from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.rendezvous._state import RunKeys
from aioelastic.rendezvous._status import format_run_status, read_run_status, watch_run_status
from aioelastic.store import MemoryEngine, MemoryStore, open_store
from aioelastic.testing import virtual_test
from aioelastic.testing.http import ServerThread
from aioelastic.timer import StoreTimerClient, run_prefix

TTL = 6.0


virtual = virtual_test  # every async test body here runs in virtual time


def handler(
    store: Any, node_id: str, *, max_nodes: int = 2, ttl: float = TTL
) -> DynamicRendezvousHandler:
    return DynamicRendezvousHandler(
        store,
        "job",
        2,
        max_nodes,
        lease_ttl=ttl,
        keep_alive_interval=ttl / 3,
        last_call_timeout=1.0,
        join_timeout=100.0,
        node_id=node_id,
        local_addr="127.0.0.1",
    )


@virtual
async def test_snapshot_of_a_formed_round_with_a_standby_then_a_crash_and_a_close() -> None:
    engine = MemoryEngine()
    observer = MemoryStore(engine)
    with pytest.raises(RendezvousNotFoundError, match="'job'"):
        await read_run_status(observer, "job")
    a, b, c = (handler(MemoryStore(engine), n) for n in ("node-a", "node-b", "node-c"))
    ra, rb = await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    standby = asyncio.get_running_loop().create_task(c.next_rendezvous())
    await settle()

    status = await read_run_status(observer, "job")
    assert status.run_id == "job"
    assert status.round == 0
    assert [(m.rank, m.node_id) for m in status.members] == list(enumerate(ra.participants))
    assert ra.participants[ra.rank] == "node-a"
    assert ra.participants[rb.rank] == "node-b"
    assert all(m.alive and not m.rejoined and m.addr == "127.0.0.1" for m in status.members)
    # just (re)granted: a full TTL left at most, more than the keep-alive interval at least
    for m in status.members:
        assert m.lease_remaining is not None
        assert TTL - TTL / 3 <= m.lease_remaining <= TTL
    assert (status.master_addr, status.master_port) == (
        ra.bootstrap_store_info.master_addr,
        ra.bootstrap_store_info.master_port,
    )
    # the round is full and intact: node-c stands by for round 1 (and drives it)
    assert status.forming_round == 1
    assert status.waiting == ()
    assert [n.node_id for n in status.standby] == ["node-c"]
    assert not status.standby[0].member
    assert status.driver == "node-c"
    assert not status.closed
    assert status.closed_after_round is None

    # node-b dies: its lease runs down, then its record goes and node-c is waiting, not standby
    crashed = next(m for m in status.members if m.node_id == "node-b")
    assert b.lease is not None
    await b.lease.aclose(revoke=False)
    await asyncio.sleep(1.5)
    status = await read_run_status(observer, "job")
    member_b = next(m for m in status.members if m.node_id == "node-b")
    assert member_b.alive
    assert member_b.lease_remaining is not None
    assert crashed.lease_remaining is not None
    assert member_b.lease_remaining == pytest.approx(crashed.lease_remaining - 1.5)
    await asyncio.sleep(TTL)
    status = await read_run_status(observer, "job")
    member_b = next(m for m in status.members if m.node_id == "node-b")
    assert not member_b.alive
    assert member_b.lease_remaining is None
    assert member_b.addr is None
    assert status.round == 0
    assert [n.node_id for n in status.waiting] == ["node-c"]
    assert status.standby == ()

    # node-a re-registers: it is waiting too, as a member; round 1 forms from a and c
    task_a = asyncio.get_running_loop().create_task(a.next_rendezvous())
    results = await asyncio.gather(task_a, standby)
    status = await read_run_status(observer, "job")
    assert status.round == 1
    assert [m.node_id for m in status.members] == list(results[0].participants)
    assert {m.node_id for m in status.members} == {"node-a", "node-c"}
    assert status.waiting == status.standby == ()

    await a.set_closed()
    status = await read_run_status(observer, "job")
    assert status.closed
    assert status.closed_after_round == 1
    assert not status.reopened
    text = format_run_status(status)
    assert "closed after round 1" in text
    assert "node-c" in text
    # nodes, not "world size" (the agent's world size counts workers)
    assert "round: 1  nodes 2  master" in text
    assert json.loads(format_run_status(status, as_json=True))["closed"] is True
    for h in (a, b, c):
        await h.aclose()
    await observer.aclose()


@virtual
async def test_rejoining_member_is_reported_waiting_and_rejoined() -> None:
    engine = MemoryEngine()
    observer = MemoryStore(engine)
    a, b = (handler(MemoryStore(engine), n) for n in ("node-a", "node-b"))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    pending = asyncio.get_running_loop().create_task(a.next_rendezvous())
    await settle()
    status = await read_run_status(observer, "job")
    assert [(m.node_id, m.rejoined) for m in status.members if m.rejoined] == [("node-a", True)]
    assert [(n.node_id, n.member) for n in status.waiting] == [("node-a", True)]
    assert status.standby == ()
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    await a.aclose()
    await b.aclose()
    await observer.aclose()


@virtual
async def test_corrupt_state_raises_naming_the_key() -> None:
    store = MemoryStore(MemoryEngine())
    keys = RunKeys("job")
    await store.put(keys.round, b"\x80pickle")
    with pytest.raises(RendezvousStateError, match="c/round"):
        await read_run_status(store, "job")
    await store.aclose()


@virtual
async def test_watch_yields_one_snapshot_per_change() -> None:
    engine = MemoryEngine()
    observer = MemoryStore(engine)
    a, b = (handler(MemoryStore(engine), n) for n in ("node-a", "node-b"))
    first = asyncio.get_running_loop().create_task(a.next_rendezvous())
    await settle()
    snapshots = watch_run_status(observer, "job")
    status = await anext(snapshots)
    assert status.round is None
    assert [n.node_id for n in status.waiting] == ["node-a"]
    await asyncio.gather(first, b.next_rendezvous())
    while status.round is None:  # the formation's writes: each snapshot covers all before it
        status = await anext(snapshots)
    assert status.round == 0
    assert len(status.members) == 2
    revision = status.revision
    await a.set_closed()
    status = await anext(snapshots)
    assert status.closed
    assert status.revision > revision
    await snapshots.aclose()
    for h in (a, b):
        await h.aclose()
    await observer.aclose()


@virtual
async def test_active_store_timers_of_the_run_are_listed_and_watched() -> None:
    engine = MemoryEngine()
    observer = MemoryStore(engine)
    a, b = (handler(MemoryStore(engine), n) for n in ("node-a", "node-b"))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    status = await read_run_status(observer, "job")
    assert status.timers == ()
    assert status.timers_prefix == run_prefix("job") == "aioelastic/run-timers/job/"
    assert "timers: none under aioelastic/run-timers/job/" in format_run_status(status)

    snapshots = watch_run_status(observer, "job")
    assert (await anext(snapshots)).timers == ()
    client = StoreTimerClient(MemoryStore(engine), "node-a:rank0", prefix=run_prefix("job"), pid=42)
    await client.acquire("train/step", 300)
    watched = await anext(snapshots)  # a timer write alone wakes the watch
    assert [(t.worker_id, t.scope_id, t.pid) for t in watched.timers] == [
        ("node-a:rank0", "train/step", 42)
    ]
    await client.acquire("checkpoint", 30)
    other = StoreTimerClient(MemoryStore(engine), "elsewhere", prefix="aioelastic/timers/")
    await other.acquire("not-this-run", 5)

    status = await read_run_status(observer, "job")
    assert [t.scope_id for t in status.timers] == ["checkpoint", "train/step"]  # soonest first
    soon, late = status.timers
    assert 25 < soon.time_left <= 30
    assert 295 < late.time_left <= 300
    assert late.expiration_time - soon.expiration_time == pytest.approx(270, abs=5)
    assert soon.key == client.key("checkpoint")
    text = format_run_status(status)
    assert f"timers (2 under {run_prefix('job')}):" in text
    assert "SCOPE" in text
    assert "train/step" in text
    assert "node-a:rank0" in text
    data = json.loads(format_run_status(status, as_json=True))
    assert [(t["scope_id"], t["pid"]) for t in data["timers"]] == [
        ("checkpoint", 42),
        ("train/step", 42),
    ]
    # another prefix, given explicitly
    elsewhere = await read_run_status(observer, "job", timers_prefix="aioelastic/timers/")
    assert [t.scope_id for t in elsewhere.timers] == ["not-this-run"]
    with pytest.raises(ValueError, match="timers_prefix"):
        await read_run_status(observer, "job", timers_prefix="")
    # released timers vanish, and the watch sees it
    await client.release("checkpoint")
    while len(watched.timers) != 1:
        watched = await anext(snapshots)
    assert [t.scope_id for t in watched.timers] == ["train/step"]
    await snapshots.aclose()
    for h in (a, b):
        await h.aclose()
    await observer.aclose()


# -- the CLI, end to end --------------------------------------------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "aioelastic", "status", *args]


async def _run(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *_cli(*args),
        cwd=ROOT,
        env=subprocess_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@asynccontextmanager
async def formed_round(
    url: str, run_id: str
) -> AsyncIterator[tuple[list[DynamicRendezvousHandler], tuple[str, ...]]]:
    """Two handlers over their own http clients, in a completed round 0 (and its members)."""
    hs = []
    for name in ("node-a", "node-b"):
        store = await open_store(url)
        h = DynamicRendezvousHandler(
            store,
            run_id,
            2,
            2,
            lease_ttl=60.0,
            last_call_timeout=0.0,
            join_timeout=60.0,
            node_id=name,
            local_addr="127.0.0.1",
            owns_store=True,
        )
        hs.append(h)
    try:
        results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
        yield hs, results[0].participants
    finally:
        for h in hs:
            await h.aclose()


@pytest.mark.timeout(120)
def test_cli_json_against_an_http_server(http_server: ServerThread) -> None:
    async def body() -> None:
        endpoint = http_server.url.removeprefix("http://")
        async with formed_round(http_server.url, "cli-json") as (_, participants):
            code, out, err = await _run("--endpoint", endpoint, "--run-id", "cli-json", "--json")
            assert code == 0, err
            data = json.loads(out)
            assert data["run_id"] == "cli-json"
            assert data["round"] == 0
            assert [(m["rank"], m["node_id"]) for m in data["members"]] == list(
                enumerate(participants)
            )
            for member in data["members"]:
                assert member["alive"]
                assert 0 < member["lease_remaining"] <= 60
            assert data["closed"] is False
            assert data["waiting"] == []
            assert data["standby"] == []
            # the full URL works too, and the table names what it shows
            code, out, err = await _run("--endpoint", http_server.url, "--run-id", "cli-json")
            assert code == 0, err
            assert "round: 0" in out
            assert "RANK" in out
            assert "node-a" in out
            assert "node-b" in out

    asyncio.run(body())


@pytest.mark.timeout(120)
def test_cli_lists_the_runs_store_timers(http_server: ServerThread) -> None:
    async def body() -> None:
        async with formed_round(http_server.url, "cli-timers"):
            store = await open_store(http_server.url)
            try:
                client = StoreTimerClient(
                    store, "node-a:0", prefix=run_prefix("cli-timers"), pid=1234
                )
                await client.acquire("epoch", 120)
                custom = StoreTimerClient(store, "w9", prefix="custom/timers/")
                await custom.acquire("slow", 60)
                code, out, err = await _run("--endpoint", http_server.url, "--run-id", "cli-timers")
                assert code == 0, err
                assert "timers (1 under aioelastic/run-timers/cli-timers/):" in out
                row = next(line for line in out.splitlines() if "epoch" in line)
                assert "node-a:0" in row
                assert "1234" in row
                assert float(row.split()[-1].rstrip("s")) > 100  # time left
                code, out, err = await _run(
                    "--endpoint", http_server.url, "--run-id", "cli-timers", "--json"
                )
                assert code == 0, err
                (timer,) = json.loads(out)["timers"]
                assert (timer["worker_id"], timer["scope_id"], timer["pid"]) == (
                    "node-a:0",
                    "epoch",
                    1234,
                )
                assert 100 < timer["time_left"] <= 120
                code, out, err = await _run(
                    "--endpoint",
                    http_server.url,
                    "--run-id",
                    "cli-timers",
                    "--json",
                    "--timers-prefix",
                    "custom/timers/",
                )
                assert code == 0, err
                assert [t["scope_id"] for t in json.loads(out)["timers"]] == ["slow"]
                await client.release("epoch")
                await custom.release("slow")
            finally:
                await store.aclose()

    asyncio.run(body())


@pytest.mark.timeout(120)
def test_cli_bad_input_is_one_line_and_exit_2(http_server: ServerThread) -> None:
    async def body() -> None:
        cases = [
            ("--endpoint", http_server.url, "--run-id", "no-such-run"),  # unknown run id
            ("--endpoint", "127.0.0.1:1", "--run-id", "job"),  # nothing listens there
            ("--endpoint", "h:99999", "--run-id", "job"),  # a malformed endpoint
            ("--endpoint", "ftp://h", "--run-id", "job"),  # an unknown scheme
            ("--endpoint", http_server.url, "--run-id", "a/b"),  # a malformed run id
        ]
        for args in cases:
            code, out, err = await _run(*args)
            assert code == 2, (args, out, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1, (args, err)
            assert lines[0].startswith("aioelastic status: "), (args, err)
            assert "Traceback" not in err
        code, _, err = await _run("--endpoint", http_server.url, "--run-id", "no-such-run")
        assert "no-such-run" in err

    asyncio.run(body())


@pytest.mark.timeout(120)
def test_cli_watch_prints_a_new_frame_after_a_change(http_server: ServerThread) -> None:
    async def body() -> None:
        async with formed_round(http_server.url, "cli-watch") as (hs, _):
            proc = await asyncio.create_subprocess_exec(
                *_cli("--endpoint", http_server.url, "--run-id", "cli-watch", "--watch", "--json"),
                cwd=ROOT,
                env=subprocess_env(),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            assert proc.stdout is not None
            try:
                first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
                assert first["round"] == 0
                assert first["closed"] is False
                await hs[0].set_closed()
                second = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
                assert second["closed"] is True
                assert second["closed_after_round"] == 0
                assert second["revision"] > first["revision"]
                assert proc.returncode is None  # still watching
            finally:
                if proc.returncode is None:
                    proc.terminate()
                await asyncio.wait_for(proc.communicate(), 30)

    asyncio.run(body())


@pytest.mark.timeout(120)
def test_cli_store_that_never_answers_times_out_with_exit_2() -> None:
    async def body() -> None:
        held: list[asyncio.StreamWriter] = []

        async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # accept the connection, never answer

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            code, _, err = await _run(
                "--endpoint", f"127.0.0.1:{port}", "--run-id", "job", "--timeout", "1"
            )
        finally:
            for writer in held:
                writer.close()
            server.close()
            await server.wait_closed()
        assert code == 2, err
        assert (
            err.strip()
            == f"aioelastic status: no answer from the store at http://127.0.0.1:{port} within 1s"
        )

    asyncio.run(body())
