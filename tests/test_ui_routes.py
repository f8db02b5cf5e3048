"""The web page's routes on a real ``HttpStoreServer`` (127.0.0.1), and the overview they serve.

``/v1/status/{run}`` is the object ``aioelastic status --json`` prints (checked against the CLI);
``/v1/ui/snapshot`` and the server-sent events of ``/v1/ui/events`` carry the overview of
:mod:`aioelastic._overview`; the page's files need no token, its data does. The browser itself is
in ``test_ui_browser.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from helpers import ROOT
from helpers.http import watcher_removed

from aioelastic._overview import changes, read_overview
from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.store import MemoryStore, Store, open_store
from aioelastic.store.http.server import HttpStoreServer
from aioelastic.sync import Election, store_lock
from aioelastic.timer import StoreTimerClient, run_prefix

pytestmark = pytest.mark.timeout(120)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[HttpStoreServer]:
    async with HttpStoreServer(port=0) as srv:
        yield srv


async def _get(url: str, token: str | None = None) -> tuple[int, bytes, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        return resp.status, await resp.read(), resp.headers.get("Content-Type", "")


async def _round(
    store: Store, run_id: str, names: tuple[str, ...]
) -> list[DynamicRendezvousHandler]:
    handlers = [
        DynamicRendezvousHandler(
            store, run_id, len(names), len(names), lease_ttl=60.0, last_call_timeout=0.0,
            join_timeout=60.0, node_id=name, local_addr="127.0.0.1",
        )
        for name in names
    ]  # fmt: skip
    await asyncio.gather(*(h.next_rendezvous() for h in handlers))
    return handlers


def _without_times(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` without what runs down between two reads (lease and timer time left)."""
    out: dict[str, Any] = json.loads(json.dumps(status))
    for group in ("members", "waiting", "standby"):
        for entry in out[group]:
            entry.pop("lease_remaining")
    for timer in out["timers"]:
        timer.pop("time_left")
    out.pop("revision")
    return out


@pytest.mark.asyncio
async def test_status_route_is_what_status_json_prints(server: HttpStoreServer) -> None:
    async with open_store(server.url) as store:
        handlers = await _round(store, "job", ("node-a", "node-b"))
        try:
            timers = StoreTimerClient(store, "w0", prefix=run_prefix("job"))
            await timers.acquire("step", 300)
            code, body, content_type = await _get(f"{server.url}/v1/status/job")
            assert code == 200
            assert content_type == "application/json"
            routed = json.loads(body)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "aioelastic", "status", "--endpoint", server.url,
                "--run-id", "job", "--json", cwd=ROOT,
                env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0
            printed = json.loads(out)
        finally:
            for h in handlers:
                await h.aclose()
    assert _without_times(routed) == _without_times(printed)
    assert [m["node_id"] for m in routed["members"]] == ["node-a", "node-b"]
    assert [m["lease_ttl"] for m in routed["members"]] == [60.0, 60.0]
    assert 0 < routed["members"][0]["lease_remaining"] <= 60
    assert [t["scope_id"] for t in routed["timers"]] == ["step"]


@pytest.mark.asyncio
async def test_status_route_errors_are_4xx_json(server: HttpStoreServer) -> None:
    code, body, _ = await _get(f"{server.url}/v1/status/nobody")
    assert code == 404
    assert json.loads(body)["error"] == "run_not_found"
    code, body, _ = await _get(f"{server.url}/v1/status/bad%20id")
    assert code == 400
    assert json.loads(body)["error"] == "bad_request"
    code, body, _ = await _get(f"{server.url}/v1/ui/snapshot?run=a/b")
    assert code == 400
    async with open_store(server.url) as store:
        await store.put("aioelastic/rdzv/broken/c/round", b"not json")
        code, body, _ = await _get(f"{server.url}/v1/status/broken")
        assert code == 422
        assert json.loads(body)["error"] == "rendezvous_state"
        # the overview shows the rest and says what is wrong
        code, body, _ = await _get(f"{server.url}/v1/ui/snapshot?run=broken")
        assert code == 200
        overview = json.loads(body)
        assert overview["run"] is None
        assert "c/round" in overview["error"]


@pytest.mark.asyncio
async def test_snapshot_lists_runs_locks_and_elections(server: HttpStoreServer) -> None:
    async with open_store(server.url) as store:
        a = await _round(store, "run-a", ("n1",))
        b = await _round(store, "run-b", ("n2",))
        # a key shaped like a queue entry but not bound to the lease it names is not one
        lease = await store.lease_grant(30)
        await store.put(f"fake/{lease.id + 1:x}_1", b"x", lease=lease.id)
        election = Election(store, "leader/of/run-a")
        try:
            async with store_lock(store, "ckpt", identity="me@here") as lock:
                async with store.watch("ckpt/") as entries:
                    second = asyncio.create_task(store_lock(store, "ckpt").acquire())
                    await asyncio.wait_for(anext(entries), 10)  # its place in the queue
                await election.campaign("node n1")
                code, body, _ = await _get(f"{server.url}/v1/ui/snapshot")
                assert code == 200
                overview = json.loads(body)
                token = lock.fencing_token
                second.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await second
        finally:
            await election.resign()
            for h in (*a, *b):
                await h.aclose()
    assert overview["v"] == 1
    assert overview["runs"] == ["run-a", "run-b"]
    assert overview["run_id"] == "run-a"  # the first, when none is asked for
    assert overview["run"]["members"][0]["node_id"] == "n1"
    queues = {q["name"]: q for q in overview["queues"]}
    assert sorted(queues) == ["ckpt", "leader/of/run-a"]
    assert queues["ckpt"]["holder"] == "me@here"
    assert queues["ckpt"]["fencing_token"] == token
    assert queues["ckpt"]["waiting"] == 1
    assert 0 < queues["ckpt"]["lease_remaining"] <= queues["ckpt"]["lease_ttl"]
    assert queues["leader/of/run-a"]["holder"] == "node n1"
    assert queues["leader/of/run-a"]["waiting"] == 0


@pytest.mark.asyncio
async def test_the_page_needs_no_token_its_data_does() -> None:
    async with HttpStoreServer(port=0, token="tok") as srv:
        pages = [("/", "text/html"), ("/ui", "text/html"), ("/ui/ui.js", "text/javascript")]
        for path, kind in [*pages, ("/ui/ui.css", "text/css")]:
            code, body, content_type = await _get(srv.url + path)
            assert code == 200, path
            assert content_type == kind + "; charset=utf-8"
            assert body
        for path in ("/v1/ui/snapshot", "/v1/ui/events", "/v1/status/x", "/v1/revision"):
            code, body, _ = await _get(srv.url + path)
            assert code == 401, path
            assert json.loads(body)["error"] == "unauthorized"
            code, _, _ = await _get(srv.url + path, token="wrong")
            assert code == 401, path
        code, body, _ = await _get(srv.url + "/v1/ui/snapshot", token="tok")
        assert code == 200
        assert json.loads(body)["runs"] == []


@pytest.mark.asyncio
async def test_page_files_are_package_data_and_fetch_nothing_from_elsewhere() -> None:
    import importlib.resources

    files = importlib.resources.files("aioelastic.store.http").joinpath("ui")
    html = files.joinpath("index.html").read_text()
    script = files.joinpath("ui.js").read_text()
    assert 'src="/ui/ui.js"' in html
    assert 'href="/ui/ui.css"' in html
    for text in (html, script, files.joinpath("ui.css").read_text()):
        assert "http://" not in text
        assert "https://" not in text
    # the token goes in a header of fetch(), kept in sessionStorage, never in a URL
    assert "new EventSource" not in script
    assert "headers.Authorization = 'Bearer ' + token" in script
    assert "localStorage" not in script


async def _events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    name = ""
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            yield name, json.loads(line[len("data: ") :])


@pytest.mark.asyncio
async def test_events_stream_pushes_a_snapshot_per_change_and_says_closing() -> None:
    srv = HttpStoreServer(port=0)
    await srv.start()
    try:
        async with (
            open_store(srv.url) as store,
            aiohttp.ClientSession() as session,
            session.get(f"{srv.url}/v1/ui/events?run=job") as resp,
        ):
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            stream = _events(resp)
            name, first = await asyncio.wait_for(anext(stream), 10)
            assert name == "snapshot"
            assert first["run"] is None
            assert first["events"] == []
            assert srv.statistics()["watch_streams"] == 1
            handlers = await _round(store, "job", ("node-a",))
            try:
                kinds: list[str] = []  # the run may appear in an earlier snapshot than its round
                while True:  # pings or snapshots before the round formed
                    name, data = await asyncio.wait_for(anext(stream), 10)
                    if name == "snapshot":
                        kinds += [e["kind"] for e in data["events"]]
                        if data["run"] and data["run"]["round"] == 0:
                            break
                assert "run" in kinds
                assert "round" in kinds
            finally:
                for h in handlers:
                    await h.aclose()
            await srv.stop()
            names = [name async for name, _ in stream]
            assert names[-1] == "closing"
    finally:
        await srv.stop()


@pytest.mark.asyncio
async def test_events_stream_refreshes_lease_times_without_writes(server: HttpStoreServer) -> None:
    """A keep-alive writes no key, so no watch sees it: while the page shows a lease the stream
    sends a fresh snapshot every TICK seconds; with nothing running down, a ping."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/v1/ui/events") as resp:
            stream = _events(resp)
            name, first = await asyncio.wait_for(anext(stream), 10)
            assert first["queues"] == []
            name, data = await asyncio.wait_for(anext(stream), 10)
            assert name == "ping"
            assert data == {"revision": first["revision"]}
        async with (
            open_store(server.url) as store,
            store_lock(store, "ckpt"),
            session.get(f"{server.url}/v1/ui/events") as resp,
        ):
            stream = _events(resp)
            name, first = await asyncio.wait_for(anext(stream), 10)
            name, again = await asyncio.wait_for(anext(stream), 10)
        assert name == "snapshot"
        assert again["revision"] == first["revision"]  # no write in between
        assert again["time"] - first["time"] >= 0.9  # TICK, not a change
        assert again["queues"][0]["lease_remaining"] != first["queues"][0]["lease_remaining"]
        assert again["events"] == []


@pytest.mark.asyncio
async def test_a_write_at_the_tick_is_a_snapshot_not_a_ping() -> None:
    """The tick and a write in the same wait: the write wins (a ping would hide it until the
    next change)."""
    from aiohttp import web

    from aioelastic.store import MemoryEngine
    from aioelastic.store.http._app import STATE, make_app
    from aioelastic.store.http._ui import _EventStream

    engine = MemoryEngine()
    state = make_app(engine)[STATE]
    loop = asyncio.get_running_loop()
    async with MemoryStore(engine=engine) as store:
        stream = _EventStream(state, store, None, web.StreamResponse())
        watcher = engine.add_watcher("", None, state)
        stream.due = True  # the tick fired ...
        engine.put("k", b"v")  # ... and a write came
        assert await stream._wait_for_change(watcher, loop.time() - 1) is True
        stream.due = True  # the tick alone
        assert await stream._wait_for_change(watcher, loop.time() - 1) is False
        engine.remove_watcher(watcher)
    engine.close()


@pytest.mark.asyncio
async def test_events_stream_ends_its_watch_when_the_page_goes(server: HttpStoreServer) -> None:
    # the server learns of the hang-up asynchronously: wait until its stream removes its watcher
    removed = watcher_removed(server.engine)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/v1/ui/events") as resp:
            await asyncio.wait_for(anext(_events(resp)), 10)
            assert server.statistics()["watch_streams"] == 1
        await asyncio.wait_for(removed.wait(), 10)
    assert server.engine.watcher_count == 0
    _, body, _ = await _get(f"{server.url}/metrics")
    assert 'op="ui_events"' in body.decode()
    assert 'code="500"' not in body.decode()


def _status(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "round": 0, "members": [], "waiting": [], "standby": [], "forming_round": 1,
        "closed": False, "closed_after_round": None, "reopened": False, "timers": [],
    }  # fmt: skip
    return {**base, **fields}


def _member(rank: int, node: str, alive: bool = True) -> dict[str, Any]:
    return {"rank": rank, "node_id": node, "alive": alive}


def _overview(run: dict[str, Any] | None, t: float = 0.0, **fields: Any) -> dict[str, Any]:
    base = {"revision": 1, "time": t, "runs": ["job"], "run_id": "job", "run": run, "queues": []}
    return {**base, **fields}


def test_changes_name_joins_losses_rounds_closes_timers_and_holders() -> None:
    r0 = _status(members=[_member(0, "a"), _member(1, "b")])
    lost = _status(members=[_member(0, "a"), _member(1, "b", alive=False)])
    joining = {**lost, "waiting": [{"node_id": "c"}]}
    r1 = _status(round=1, forming_round=2, members=[_member(0, "a"), _member(1, "c")])
    closed = {**r1, "closed": True, "closed_after_round": 1}

    def texts(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
        return [e["text"] for e in changes(_overview(before), _overview(after))]

    assert changes(None, _overview(r0)) == []
    assert texts(r0, lost) == ["b (rank 1) lost"]
    assert texts(lost, joining) == ["c joins round 1"]
    assert texts(joining, r1) == ["round 1 formed: a (rank 0), c (rank 1)"]
    assert texts(r0, r1) == ["round 1 formed: a (rank 0), c (rank 1)", "b is not in round 1"]
    assert texts(r1, closed) == ["run closed after round 1"]
    assert texts(closed, {**r1, "reopened": True, "closed_after_round": 1}) == ["run reopened"]

    timer = {"key": "t/w/s", "scope_id": "s", "worker_id": "w", "time_left": 1.0}
    armed = _overview(_status(timers=[timer]), t=0.0)
    assert [e["kind"] for e in changes(_overview(_status()), armed)] == ["timer"]
    # gone before its deadline: released; gone after it: reaped
    assert changes(armed, _overview(_status(), t=0.5))[0]["text"] == "timer s of w released"
    reaped = changes(armed, _overview(_status(), t=1.5))[0]
    assert reaped["kind"] == "reaped"
    assert reaped["time"] == 1.5

    q = {"name": "ckpt", "holder": "x", "fencing_token": 5}
    held = _overview(None, queues=[q])
    assert [e["text"] for e in changes(_overview(None), held)] == ["ckpt: held by x (token 5)"]
    moved = _overview(None, queues=[{**q, "holder": "y", "fencing_token": 9}])
    assert [e["text"] for e in changes(held, moved)] == ["ckpt: held by y (token 9)"]
    assert [e["text"] for e in changes(moved, _overview(None))] == [
        "ckpt: released, nobody holds it"
    ]


@pytest.mark.asyncio
async def test_read_overview_of_an_empty_store() -> None:
    async with MemoryStore() as store:
        overview = await read_overview(store)
        assert overview["runs"] == []
        assert overview["run"] is None
        assert overview["run_id"] is None
        assert overview["error"] is None
        with pytest.raises(ValueError, match="run_id"):
            await read_overview(store, "a/b")


def test_store_modules_import_nothing_above_them_at_module_level() -> None:
    """store/ stays below rendezvous/, timer/ and sync/ (DESIGN.md's layers): its modules import
    them (the page's overview) only inside functions, when a page or a script asks."""
    import ast

    above = ("rendezvous", "timer", "sync", "agent", "_overview")
    store_dir = ROOT / "aioelastic" / "store"
    offenders = []
    for path in sorted(store_dir.rglob("*.py")):
        depth = len(path.relative_to(store_dir).parts)  # 1: store/x.py, 2: store/http/x.py
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                absolute = module.startswith("aioelastic.")
                if absolute or node.level == depth + 1:  # ``from ...rendezvous import``
                    first = module.removeprefix("aioelastic.").split(".")[0]
                    if first in above:
                        offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []


def test_the_overview_is_imported_at_the_first_request() -> None:
    import subprocess

    code = """
import asyncio, sys
from aioelastic.store import MemoryEngine
from aioelastic.store.http.server import HttpStoreServer, make_app
make_app(MemoryEngine())
print("aioelastic._overview" in sys.modules)
async def ask():
    import aiohttp
    async with HttpStoreServer(port=0) as srv, aiohttp.ClientSession() as s:
        async with s.get(srv.url + "/v1/ui/snapshot") as r:
            assert r.status == 200
asyncio.run(ask())
print("aioelastic._overview" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
    )
    assert out.stdout.split("\n")[:2] == ["False", "True"]


@pytest.mark.asyncio
async def test_events_streams_count_against_max_watch_streams() -> None:
    async with (
        HttpStoreServer(port=0, max_watch_streams=1) as srv,
        aiohttp.ClientSession() as session,
        session.get(f"{srv.url}/v1/ui/events") as first,
    ):
        await asyncio.wait_for(anext(_events(first)), 10)
        code, body, _ = await _get(f"{srv.url}/v1/ui/events")
        assert code == 503
        assert json.loads(body)["error"] == "too_many_watches"
        code, _, _ = await _get(f"{srv.url}/v1/watch/")
        assert code == 503
