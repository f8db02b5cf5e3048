"""The web page of ``aioelastic serve`` (``/ui``) in a real headless browser.

Debian's chromium, driven by Playwright's Python package (its own browser download is not used):
a server subprocess, a job of two rendezvous node processes, the page following it live: both
members with their ranks, one SIGKILLed and gone with the round changing, the run closed, the
server stopped (the page says so) and started again (the page says it is back); with a token,
the page refuses to show anything without it. Without chromium (``AIOELASTIC_CHROMIUM`` names
another binary) or playwright the tests skip, or fail when ``AIOELASTIC_REQUIRE_BROWSER`` is set
(CI sets it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import free_port
from helpers.http import ROOT, ServerProcess, self_signed_cert

pytestmark = pytest.mark.timeout(60)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Seconds a page may take to show a change (generous: the machine is shared).
WAIT_MS = 15_000
RUN = "webjob"
NOTHING = "\u2013"  # what the page shows where it has no data (an en dash)
#: Where to save the page's screenshot (docs/images/ui.png is made so); default: the test's
#: temporary directory, so a test run leaves the checkout as it was.
SCREENSHOT_ENV = "AIOELASTIC_UI_SCREENSHOT"


def _unusable(reason: str) -> None:
    if os.environ.get("AIOELASTIC_REQUIRE_BROWSER"):
        pytest.fail(f"AIOELASTIC_REQUIRE_BROWSER is set but the browser is unusable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unusable("playwright is not installed (pip install playwright)")
    chromium = (
        os.environ.get("AIOELASTIC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    )
    if not Path(chromium).exists():
        _unusable("chromium is not installed (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def _node(url: str, out: Path, **env_vars: str) -> subprocess.Popen[str]:
    """A rendezvous node (tests/rdzv_node.py): 1 to 2 nodes, 2 s lease, 2 s last call; what it
    prints (its rounds, with its node id) goes to ``out``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **env_vars)
    with out.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "rdzv_node.py"), url, RUN, "1", "2", "2", "2"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _node_id(out: Path) -> str:
    """The node id a node process printed with its first round."""
    for line in out.read_text().splitlines():
        if line.startswith("ROUND "):
            node: str = json.loads(line[len("ROUND ") :])["node"]
            return node
    raise AssertionError(f"no round in {out}: {out.read_text()[-2000:]}")


class _Loop:
    """An event loop on a thread of its own: the test's store clients (playwright's sync API
    keeps the test's thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, make: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
        async def call() -> Any:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def side() -> Iterator[_Loop]:
    loop = _Loop()
    try:
        yield loop
    finally:
        loop.close()


class _Extras:
    """A lock held and a store timer armed, so the page (and its screenshot) shows them: one
    task holds them (a lock is released by the task that took it) until :meth:`stop`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.task: asyncio.Task[None] | None = None
        self.done = asyncio.Event()

    async def start(self) -> None:
        ready = asyncio.Event()
        self.task = asyncio.create_task(self._hold(ready))
        readied = asyncio.create_task(ready.wait())
        await asyncio.wait([self.task, readied], timeout=20, return_when=asyncio.FIRST_COMPLETED)
        readied.cancel()
        if self.task.done():
            self.task.result()
        assert ready.is_set()

    async def _hold(self, ready: asyncio.Event) -> None:
        from aioelastic.store import open_store
        from aioelastic.sync import store_lock
        from aioelastic.timer import StoreTimerClient, run_prefix

        async with (
            open_store(self.url) as store,
            store_lock(store, "webjob/checkpoint-writer", identity="trainer@host-a"),
        ):
            timers = StoreTimerClient(store, "worker-0", prefix=run_prefix(RUN), pid=os.getpid())
            await timers.acquire("epoch-3", 600)
            ready.set()
            await self.done.wait()
            await timers.release("epoch-3")

    async def stop(self) -> None:
        self.done.set()
        if self.task is not None:
            await self.task


async def _close_run(url: str) -> None:
    from aioelastic.rendezvous import DynamicRendezvousHandler
    from aioelastic.store import open_store

    async with open_store(url) as store:
        handler = DynamicRendezvousHandler(store, RUN, 1, 2)
        try:
            await handler.set_closed()
        finally:
            await handler.aclose()


async def _put_round(url: str, run_id: str) -> None:
    """A completed round 3 of ``run_id`` whose members x and y have no records (gone)."""
    from aioelastic.rendezvous._state import RoundRecord, RunKeys, roster_chunks
    from aioelastic.store import open_store

    async with open_store(url) as store:
        keys = RunKeys(run_id)
        (chunk,) = roster_chunks(("x", "y"))
        await store.put(keys.chunk(3, 0), chunk.encode())
        record = RoundRecord(3, 2, "127.0.0.1", 29500, chunks=1)
        await store.put(keys.round, record.encode())


def _members(page: Any) -> Any:
    return page.locator("#members tbody tr[data-rank]")


def test_page_follows_a_job_live(browser: Any, side: _Loop, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    port = free_port()
    server = ServerProcess("--port", str(port)).start()
    outs = [tmp_path / "node0.out", tmp_path / "node1.out"]
    nodes = [_node(server.url, out) for out in outs]
    extras = _Extras(server.url)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        side.run(extras.start)
        page.goto(server.url + "/ui")
        expect(page.locator("#conn")).to_have_text("connected", timeout=WAIT_MS)
        expect(page.locator("#run-id")).to_have_text(RUN, timeout=WAIT_MS)
        # both nodes in one round, ranks 0 and 1, alive, their leases shown
        expect(_members(page)).to_have_count(2, timeout=WAIT_MS)
        expect(page.locator("#members td.rank")).to_have_text(["0", "1"])
        expect(page.locator("#members tr.alive")).to_have_count(2)
        expect(page.locator("#members .lease .fill")).to_have_count(2)
        holder = page.locator("#queues tr[data-name='webjob/checkpoint-writer'] td").nth(1)
        expect(holder).to_have_text("trainer@host-a", timeout=WAIT_MS)
        expect(page.locator("#timers tr[data-scope='epoch-3']")).to_have_count(1)
        round_before = int(page.locator("#round").inner_text().split()[0])
        page.wait_for_timeout(600)  # let the lease bars run down a little
        shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "ui.png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)

        # one node killed: its member row goes, and a new round forms without it
        victim = page.locator("#members tr[data-rank='1']").get_attribute("data-node")
        survivor = page.locator("#members tr[data-rank='0']").get_attribute("data-node")
        assert victim
        assert survivor
        killed = {_node_id(out): node for out, node in zip(outs, nodes, strict=True)}[victim]
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        expect(_members(page)).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#members td.node")).to_have_text([survivor])
        round_after = int(page.locator("#round").inner_text().split()[0])
        assert round_after > round_before
        expect(page.locator("#events")).to_contain_text(f"round {round_after} formed")
        # seen lost (its lease expired) or, if the new round came first, not in it
        expect(page.locator("#events li").filter(has_text=victim)).not_to_have_count(0)

        # the run closed: the page says so
        side.run(lambda: _close_run(server.url))
        expect(page.locator("#run-state")).to_have_text(
            f"closed after round {round_after}", timeout=WAIT_MS
        )
        expect(page.locator("#events")).to_contain_text("run closed")

        # a second run: its link shows it (the choice kept in the address), and back
        side.run(lambda: _put_round(server.url, "other"))
        expect(page.locator("#runs a")).to_have_text(["other", RUN], timeout=WAIT_MS)
        expect(page.locator("#run-id")).to_have_text(RUN)  # not switched to the new first run
        page.click("#runs a >> text=other")
        expect(page.locator("#run-id")).to_have_text("other", timeout=WAIT_MS)
        assert page.url.endswith("#run=other")
        expect(page.locator("#round")).to_have_text("3 (2 nodes)")
        expect(page.locator("#members tr.gone")).to_have_count(2)  # no node records: gone
        page.click(f"#runs a >> text={RUN}")
        expect(page.locator("#run-state")).to_have_text(
            f"closed after round {round_after}", timeout=WAIT_MS
        )

        # the server stopped: the page says the connection is lost; started again: it is back
        side.run(extras.stop)
        code, _ = server.terminate()
        assert code == 0
        expect(page.locator("#conn")).to_contain_text("connection lost", timeout=WAIT_MS)
        expect(page.locator("#conn")).to_contain_text("the server stopped")
        expect(page.locator("#conn")).to_have_class("conn lost")
        server = ServerProcess("--port", str(port)).start()
        expect(page.locator("#conn")).to_contain_text("connected again", timeout=WAIT_MS)
        expect(page.locator("#runs")).to_contain_text("no runs in the store")
    finally:
        page.close()
        for node in nodes:
            if node.poll() is None:
                node.kill()
            node.wait(10)
        server.kill()


def test_page_needs_the_token_and_keeps_it_out_of_urls(browser: Any, tmp_path: Path) -> None:
    """With --token-file and TLS: nothing shows without the token, a wrong one is refused, the
    right one (typed in the page) connects; it travels in a header, never in a URL, and stays in
    the tab's sessionStorage."""
    token = "s3cret-ui-token"
    (tmp_path / "token").write_text(token + "\n")
    with self_signed_cert(tmp_path) as (cert, key):
        server = ServerProcess(
            "--token-file", str(tmp_path / "token"), "--tls-cert", str(cert), "--tls-key", str(key)
        ).start()
        assert server.url.startswith("https://")
        # the node's client takes the token from the environment, OpenSSL the CA
        node = _node(
            server.url, tmp_path / "n.out", AIOELASTIC_TOKEN=token, SSL_CERT_FILE=str(cert)
        )
        try:
            _refused_then_shown(browser, server.url, token)
        finally:
            node.kill()
            node.wait(10)
            server.kill()
    assert token not in "".join(server.banner)


def _refused_then_shown(browser: Any, url: str, token: str) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(ignore_https_errors=True)
    page = context.new_page()
    urls: list[str] = []
    statuses: list[tuple[str, int]] = []
    page.on("request", lambda request: urls.append(request.url))
    page.on("response", lambda response: statuses.append((response.url, response.status)))
    try:
        page.goto(url + "/ui")
        expect(page.locator("#auth")).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#auth-message")).to_have_text("This server needs a token.")
        expect(page.locator("#conn")).to_contain_text("a token is needed")
        expect(page.locator("#run-id")).to_have_text(NOTHING)  # nothing shown
        expect(page.locator("#runs a")).to_have_count(0)
        assert any(u.endswith("/v1/ui/events") and s == 401 for u, s in statuses)

        page.fill("#token", "not-the-token")
        page.click("#auth button")
        expect(page.locator("#auth-message")).to_contain_text("refused", timeout=WAIT_MS)
        expect(page.locator("#run-id")).to_have_text(NOTHING)
        expect(page.locator("#runs a")).to_have_count(0)

        page.fill("#token", token)
        page.click("#auth button")
        expect(page.locator("#conn")).to_have_text("connected", timeout=WAIT_MS)
        expect(page.locator("#auth")).to_be_hidden()
        expect(page.locator("#run-id")).to_have_text(RUN, timeout=WAIT_MS)
        expect(_members(page)).to_have_count(1, timeout=WAIT_MS)
        assert page.evaluate("sessionStorage.getItem('aioelastic.token')") == token
        assert page.evaluate("localStorage.length") == 0
        assert urls
        assert not [u for u in urls if token in u or "not-the-token" in u]
    finally:
        context.close()
