"""Silent connections and floods against the HTTP store server: sockets that never send a byte
or never finish a TLS handshake are closed within the read timeout, ``max_connections`` holds
with a clear 503, ``/healthz`` answers through it all, and the log is one line a second at most
(also in a subprocess out of file descriptors)."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import resource
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from helpers.http import ROOT, ServerProcess, self_signed_cert
from helpers.waiting import eventually

from aioelastic.errors import StoreConnectionError
from aioelastic.store import open_store
from aioelastic.store.http._connections import ConnectionBudget, LogLimiter
from aioelastic.store.http.server import HttpStoreServer

READ_TIMEOUT = 0.5
#: Generous: the machine is shared.
SLACK = 5.0


async def _get(url: str, ssl_context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    connector = aiohttp.TCPConnector(ssl=ssl_context if ssl_context is not None else False)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp,
    ):
        return resp.status, await resp.read()


async def _closed_after(reader: asyncio.StreamReader) -> float:
    """Seconds until the server closes this connection (whatever it wrote first)."""
    start = time.monotonic()
    while await reader.read(65536):
        pass
    return time.monotonic() - start


def _metric(text: str, name: str, label: str) -> float:
    match = re.search(rf'^{name}\{{[^}}]*"{label}"[^}}]*\}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.mark.asyncio
async def test_silent_sockets_are_closed_at_the_read_timeout_and_healthz_answers() -> None:
    """30 sockets that never send a byte against max_connections=8 and a 0.5 s read timeout:
    all are closed at the read timeout (they were kept for the 75 s keep-alive timeout), and
    /healthz answers meanwhile, on a connection over the limit."""
    async with HttpStoreServer(port=0, read_timeout=READ_TIMEOUT, max_connections=8) as srv:
        flood = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(30)]
        try:
            closing = [asyncio.ensure_future(_closed_after(reader)) for reader, _ in flood]
            assert await _get(f"{srv.url}/healthz") == (200, b'{"status":"ok"}')
            waited = await asyncio.wait_for(asyncio.gather(*closing), READ_TIMEOUT + SLACK)
            assert max(waited) < READ_TIMEOUT + SLACK
        finally:
            for _, writer in flood:
                writer.close()
        status, body = await _get(f"{srv.url}/metrics")
        assert status == 200
        assert _metric(body.decode(), "aioelastic_requests_total", "408") >= 1
        text = body.decode()
        # Each of the 22 beyond the limit either went over it or, when the flood took longer
        # than the grace (a loaded machine), closed an older silent one to make room.
        over = _metric(text, "aioelastic_connections_refused_total", "over_limit")
        assert over + _metric(text, "aioelastic_connections_refused_total", "silent_closed") >= 22
        assert (await _get(f"{srv.url}/v1/revision"))[0] == 200


@pytest.mark.asyncio
async def test_the_oldest_silent_connection_makes_room_once_it_was_silent_a_while() -> None:
    """With every slot held by silent sockets, a request is refused (503) while they are fresh
    (a client that just connected is about to speak), and served once they have been silent
    for the grace (half the read timeout, at most 1 s): the oldest is closed for it."""
    async with HttpStoreServer(port=0, read_timeout=30, max_connections=8) as srv:
        started = time.monotonic()
        silent = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(8)]
        try:
            status, body = await _get(f"{srv.url}/v1/revision")
            if time.monotonic() - started < 0.9:  # (else the grace had passed: a loaded machine)
                assert (status, json.loads(body)["error"]) == (503, "too_many_connections")
            await asyncio.sleep(1.2)  # under test: past the grace, the oldest silent one makes room
            assert (await _get(f"{srv.url}/v1/revision"))[0] == 200
            assert await asyncio.wait_for(_closed_after(silent[0][0]), SLACK) < SLACK
        finally:
            for _, writer in silent:
                writer.close()
        status, body = await _get(f"{srv.url}/metrics")
        assert status == 200
        assert _metric(body.decode(), "aioelastic_connections_refused_total", "silent_closed") >= 1


async def _watch(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/watch/w?progress_interval=0.2 HTTP/1.1\r\nHost: x\r\n\r\n")
    line = await asyncio.wait_for(reader.readline(), 10)
    assert line.startswith(b"HTTP/1.1 200"), line
    return reader, writer


@pytest.mark.asyncio
async def test_connections_beyond_the_limit_get_503_but_healthz_answers() -> None:
    async with HttpStoreServer(port=0, read_timeout=READ_TIMEOUT, max_connections=4) as srv:
        busy = [await _watch(srv.port) for _ in range(4)]
        try:
            status, body = await _get(f"{srv.url}/v1/revision")
            assert status == 503
            error = json.loads(body)
            assert error["error"] == "too_many_connections"
            assert "at most 4 connections" in error["message"]
            assert await _get(f"{srv.url}/healthz") == (200, b'{"status":"ok"}')
        finally:
            for _, writer in busy:
                writer.close()
        # the server sees the hang-ups
        await eventually(lambda: srv.statistics()["watch_streams"] == 0, 5, "streams kept")
        assert (await _get(f"{srv.url}/v1/revision"))[0] == 200


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[ssl.SSLContext, ssl.SSLContext]]:
    pytest.importorskip("cryptography")
    with self_signed_cert(tmp_path) as (cert, key):
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert, key)
        yield server, ssl.create_default_context(cafile=str(cert))


@pytest.mark.asyncio
async def test_a_tls_connection_that_never_handshakes_is_closed_at_the_read_timeout(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_context, client_context = tls
    async with HttpStoreServer(
        port=0, ssl_context=server_context, read_timeout=READ_TIMEOUT
    ) as srv:
        silent = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(10)]
        try:
            closing = [asyncio.ensure_future(_closed_after(reader)) for reader, _ in silent]
            assert (await _get(f"{srv.url}/healthz", client_context))[0] == 200
            waited = await asyncio.wait_for(asyncio.gather(*closing), READ_TIMEOUT + SLACK)
            assert max(waited) < READ_TIMEOUT + SLACK  # asyncio's default: 60 s
        finally:
            for _, writer in silent:
                writer.close()


@pytest.mark.asyncio
async def test_serve_with_a_short_read_timeout_and_few_connections_outlasts_a_flood(
    tmp_path: Path,
) -> None:
    """``aioelastic serve --tls-cert ... --read-timeout 0.5 --max-connections 16`` against 150
    sockets that never handshake and 150 that handshake and then say nothing: /healthz answers
    through it, every socket is closed within the read timeout, and the log stays a few lines
    (it was 221,178 lines of accept tracebacks for 21,000 sockets)."""
    pytest.importorskip("cryptography")
    with self_signed_cert(tmp_path) as (cert, key):
        client_context = ssl.create_default_context(cafile=str(cert))
        args = ("--tls-cert", str(cert), "--tls-key", str(key), "--read-timeout", "0.5")
        with ServerProcess(*args, "--max-connections", "16") as srv:
            assert "at most 16 connections" in "".join(srv.banner)
            port = int(srv.url.rsplit(":", 1)[1])
            raw = [await asyncio.open_connection("127.0.0.1", port) for _ in range(150)]
            quiet = [
                await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
                for _ in range(150)
            ]
            try:
                closing = [asyncio.ensure_future(_closed_after(r)) for r, _ in raw + quiet]
                for _ in range(3):
                    assert (await _get(f"{srv.url}/healthz", client_context))[0] == 200
                waited = await asyncio.wait_for(asyncio.gather(*closing), READ_TIMEOUT + 2 * SLACK)
                assert max(waited) < READ_TIMEOUT + 2 * SLACK
            finally:
                for _, writer in raw + quiet:
                    writer.close()
            assert (await _get(f"{srv.url}/v1/revision", client_context))[0] == 200
            code, out = srv.terminate()
    assert code == 0
    assert len(out.splitlines()) <= 10, out[:3000]


def test_the_log_limiter_lets_one_line_a_second_through_and_counts_the_rest() -> None:
    now = [0.0]
    events: list[str] = []
    limiter = LogLimiter(clock=lambda: now[0], on_event=events.append)
    emfile = OSError(errno.EMFILE, "Too many open files")

    def record(exc: BaseException | None = None, level: int = logging.ERROR) -> logging.LogRecord:
        exc_info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("asyncio", level, __file__, 1, "accept failed", None, exc_info)

    assert limiter.filter(record(emfile))
    passed = [limiter.filter(record(emfile)) for _ in range(1000)]
    assert not any(passed)
    assert limiter.filter(record(level=logging.INFO))  # below WARNING: never limited
    now[0] = 1.0
    line = record()
    assert limiter.filter(line)
    assert line.getMessage() == "accept failed (1000 similar lines suppressed)"
    assert (limiter.suppressed, limiter.fd_exhausted) == (1000, 1001)
    assert events.count("suppressed") == 1000
    assert events.count("fd_exhausted") == 1001


class _Conn:
    def __init__(self) -> None:
        self.over_limit = False
        self.closed = False

    def close_silent(self) -> None:
        self.closed = True


def test_the_budget_closes_the_oldest_silent_connection_first() -> None:
    refused: list[str] = []
    budget = ConnectionBudget(2, 1.0, refused.append)
    a, b, c, d, e = _Conn(), _Conn(), _Conn(), _Conn(), _Conn()
    budget.opened(a, 0.0)
    budget.opened(b, 0.5)
    budget.opened(c, 0.9)  # a has been silent less than the grace: c is over the limit
    assert (a.closed, c.over_limit) == (False, True)
    budget.closed(c)
    budget.spoke(b)
    budget.opened(d, 1.0)  # a, silent for 1 s, makes room
    assert (a.closed, b.closed, d.over_limit) == (True, False, False)
    budget.closed(a)  # its connection_lost: already uncounted
    assert budget.open == 2
    budget.spoke(d)
    budget.opened(e, 5.0)  # nobody silent: e is over the limit, served /healthz only
    assert e.over_limit
    assert refused == ["over_limit", "silent_closed", "over_limit"]
    budget.closed(e)
    assert budget.open == 2


# -- a subprocess with few file descriptors -------------------------------------------------------


def _serve_with_fd_limit(soft: int, hard: int, *args: str) -> subprocess.Popen[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "aioelastic", "serve", "--port", "0", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=limit,
    )


@pytest.fixture(params=["asyncio", "uvloop"])
def low_fd_server(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[str, list[str], subprocess.Popen[str]]]:
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
    proc = _serve_with_fd_limit(200, 256, "--read-timeout", "2", "--loop", request.param)
    assert proc.stdout is not None
    banner: list[str] = []
    url = ""
    while not url:
        line = proc.stdout.readline()
        assert line, "".join(banner)
        banner.append(line)
        match = re.search(r"listening on (\S+)", line)
        url = match.group(1) if match else ""
    try:
        yield url, banner, proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.asyncio
async def test_out_of_descriptors_a_clear_refusal_healthz_and_no_log_flood(
    low_fd_server: tuple[str, list[str], subprocess.Popen[str]],
) -> None:
    """``ulimit -n`` 200 (hard 256): the server raises it to 256 and holds what that allows
    (128 connections). Of 400 watch requests at once, the rest get 503 ``too_many_connections``
    while descriptors last; beyond them, asyncio leaves connections in the listen backlog until
    some are free (every one is answered) and uvloop (libuv) closes them at once (the client sees
    the connection closed, never a hang). /healthz answers, and the log has a line a second at
    most, with descriptor exhaustion counted in /metrics."""
    url, banner, proc = low_fd_server
    text = "".join(banner)
    uvloop = "uvloop loop" in text
    assert "open-file limit raised from 200 to 256" in text
    assert "at most 128 connections" in text
    port = int(url.rsplit(":", 1)[1])

    async def watch() -> bytes:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            return f"connect: {exc}".encode()
        held.append(writer)
        writer.write(b"GET /v1/watch/w HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (OSError, asyncio.IncompleteReadError) as exc:
            return f"read: {exc!r}".encode()

    held: list[asyncio.StreamWriter] = []
    started = time.monotonic()
    try:
        answers = await asyncio.gather(*(watch() for _ in range(400)))
        served = [a for a in answers if a.startswith(b"HTTP/1.1 200")]
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(served) == 128, [a for a in answers if a not in served][:3]
        closed = [a for a in answers if a.startswith(b"read: IncompleteReadError(")]
        assert len(served) + len(refused) + len(closed) == 400, set(answers)
        assert len(refused) >= 64
        assert not closed or uvloop, closed[:3]
        assert all(b"Retry-After: 1" in a for a in refused)
        assert await _get(f"{url}/healthz") == (200, b'{"status":"ok"}')
        # 503 is tried again (full-jitter backoff) until the request deadline, then says why
        async with open_store(url, read_retries=0, timeout=1.0) as store:
            with pytest.raises(StoreConnectionError, match="at most 128 connections"):
                await store.put("k", b"v")
    finally:
        for writer in held:
            writer.close()
    for _ in range(100):  # until the server has seen the watches go
        status, body = await _get(f"{url}/metrics")
        if status == 200:
            break
        await asyncio.sleep(0.1)
    metrics = body.decode()
    assert _metric(metrics, "aioelastic_connections_refused_total", "over_limit") >= 64
    if not uvloop:  # libuv does not report the descriptors it ran out of
        assert _metric(metrics, "aioelastic_log_events_total", "fd_exhausted") >= 1
        assert _metric(metrics, "aioelastic_log_events_total", "suppressed") >= 1
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    # One record a second at most (a record may carry a traceback): asyncio's accept loop alone
    # logs one per pending connection per retry when out of descriptors: 268,218 lines.
    assert out.count("Traceback (most recent call last)") <= 2 + (time.monotonic() - started)
    assert len(out) < 50_000, out[:3000]
