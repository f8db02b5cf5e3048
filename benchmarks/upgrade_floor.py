"""A prototype transport for the session, measured: an HTTP Upgrade on an aiohttp route, then a
raw framed protocol on the same connection, next to aiohttp's WebSocket, a bare asyncio Protocol,
the store's own session get and torch's TCPStore get, in one run.

    PYTHONPATH=. python benchmarks/upgrade_floor.py [--trips 20000] [--depth 64] [--repeat 3]

The upgrade server is an aiohttp ``web.Application`` whose handler checks the ``Upgrade:
aioelastic-session/1`` and ``Authorization`` headers, moves the connection to a protocol of its
own with the public ``transport.set_protocol()``, answers ``101 Switching Protocols`` through a
plain ``web.StreamResponse`` and then stays in the handler until the connection ends (as
aiohttp's ``WebSocketResponse`` does: while the handler runs, aiohttp's keep-alive timer and its
parser leave the connection alone). The protocol forwards ``connection_lost`` to aiohttp's
``RequestHandler`` (``request.protocol``) so aiohttp forgets the connection. The client sends
the upgrade request itself over ``loop.create_connection``, reads the 101's head and then speaks
frames: a 4-byte big-endian length and a msgpack body. It sends nothing before the 101 (aiohttp's
parser only treats ``websocket`` and ``tcp`` upgrades as upgrades: bytes after an upgrade to
anything else would be parsed as HTTP).

Rows (``--trips`` round trips one at a time, then the same with ``--depth`` callers in flight,
each sending its own message; the servers answer everything one read brought in one write):

- ``aiohttp WebSocket``: echo of a 14-byte binary message (``ws_floor.py``'s row);
- ``upgrade + frames, echo``: the same message as one frame (the client coalesces the frames
  its callers wrote in one loop iteration into one write);
- ``asyncio Protocol``: bare echo, no framing (``ws_floor.py``'s row);
- ``upgrade + frames, get``: ``[id, "get", key]`` decoded on the server, a dict lookup, ``[id,
  value]`` (64 bytes) encoded back, decoded by the client and matched to its caller by id;
- ``session get (store client)``: the store's ``get`` of a 64-byte value from ``aioelastic
  serve`` (whatever transport the client speaks);
- ``serve, raw upgrade, by hand``: the session protocol's ``get`` frames written by hand to
  ``aioelastic serve`` over its upgrade of ``/v1/session`` (the server's cost with no client
  library in between);
- ``TCPStore get``: torch's C++ store, its server a subprocess too, sequential only.

Each server is a subprocess, so server and client have a core each; CPU per trip of both sides
is read from the kernel. Median and runs of ``--repeat`` alternated rounds. uvloop on both sides
when installed (``--loop``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
from aiohttp import web

from benchmarks.ws_floor import (
    MESSAGE,
    Figure,
    _cpu,
    _EchoProtocol,
    _proto_client,
    _row,
    _server_cpu,
    _session_client,
    _ws_client,
    _ws_echo,
    measure_pattern,
)

ROOT = Path(__file__).resolve().parent.parent
UPGRADE = "aioelastic-session/1"
TOKEN = "bench-token"  # a benchmark's fixed token: checked as the real server would
VALUE = b"x" * 64
_HEAD_LIMIT = 16 * 1024


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def _split(buffer: bytearray, data: bytes) -> tuple[list[memoryview], int, bytes]:
    """The complete frames of what ``buffer`` held plus ``data``: their bodies, the length of
    the bytes they take and those bytes; the incomplete rest stays in ``buffer``."""
    if buffer:
        buffer += data
        data = bytes(buffer)
        buffer.clear()
    view = memoryview(data)
    bodies: list[memoryview] = []
    position, end = 0, len(view)
    while end - position >= 4:
        size = int.from_bytes(view[position : position + 4], "big")
        if end - position - 4 < size:
            break
        bodies.append(view[position + 4 : position + 4 + size])
        position += 4 + size
    if position < end:
        buffer += view[position:]
    return bodies, position, data


# -- the upgrade server (runs in the subprocess) --------------------------------------------------


class _SessionProtocol(asyncio.Protocol):
    """What the connection speaks after the 101; tells aiohttp's handler when it ends."""

    def __init__(self, handler: asyncio.BaseProtocol, data: dict[str, bytes]) -> None:
        self.handler = handler
        self.data = data
        self.buffer = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.handler.connection_lost(exc)  # aiohttp drops the connection from its server

    def answer(self, bodies: list[memoryview], framed: bytes) -> bytes:
        return framed  # echo: the complete frames as they came

    def data_received(self, data: bytes) -> None:
        bodies, length, data = _split(self.buffer, data)
        if bodies:
            self.transport.write(self.answer(bodies, data[:length]))


class _GetProtocol(_SessionProtocol):
    def answer(self, bodies: list[memoryview], framed: bytes) -> bytes:
        out = []
        for body in bodies:
            request_id, _op, key = msgpack.unpackb(body)
            out.append(_frame(msgpack.packb([request_id, self.data.get(key)])))
        return b"".join(out)


def _upgrade_route(kind: type[_SessionProtocol], data: dict[str, bytes]) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.Response(status=401, text="bad token\n")
        if request.headers.get("Upgrade", "").lower() != UPGRADE:
            return web.Response(status=426, text=f"Upgrade: {UPGRADE} required\n")
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("the client went away before the upgrade")
        protocol = kind(request.protocol, data)
        protocol.task = request.task  # aiohttp's task for the connection (for tests to await)
        transport.set_protocol(protocol)  # from here on, reads go to protocol
        response = web.StreamResponse(
            status=101, headers={"Upgrade": UPGRADE, "Connection": "Upgrade"}
        )
        response.force_close()
        sessions = request.app[SESSIONS]
        sessions.add(protocol)
        try:
            await response.prepare(request)
            protocol.connection_made(transport)
            await protocol.closed  # aiohttp leaves a connection alone while its handler runs
        finally:
            sessions.discard(protocol)
        return response

    return handler


SESSIONS: web.AppKey[set[_SessionProtocol]] = web.AppKey("sessions")


async def _close_sessions(app: web.Application) -> None:
    """On shutdown: without this, aiohttp waits for each session's handler for twice its
    ``shutdown_timeout`` (60 s by default) before it cancels it."""
    sessions = app[SESSIONS]
    for protocol in list(sessions):
        protocol.transport.close()


def build_app(data: dict[str, bytes]) -> web.Application:
    """The WebSocket echo on ``/ws``; the upgrade echo and get on ``/session/echo|get``."""
    app = web.Application()
    app[SESSIONS] = set()
    app.on_shutdown.append(_close_sessions)
    app.router.add_get("/ws", _ws_echo)
    app.router.add_get("/session/echo", _upgrade_route(_SessionProtocol, data))
    app.router.add_get("/session/get", _upgrade_route(_GetProtocol, data))
    return app


async def _serve(kind: str) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    if kind == "proto":
        server = await loop.create_server(_EchoProtocol, "127.0.0.1", 0)
        print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
        await stop
        server.close()
        return
    runner = web.AppRunner(build_app({"k": VALUE}), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"port {runner.addresses[0][1]}", flush=True)
    await stop
    await runner.cleanup()


def _serve_tcpstore() -> None:
    distributed: Any = importlib.import_module("torch.distributed")
    store = distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set("k", VALUE)
    print(f"port {store.port}", flush=True)
    signal.sigwait({signal.SIGTERM})


# -- the upgrade client ---------------------------------------------------------------------------


class UpgradeClient(asyncio.Protocol):
    """Sends the upgrade request, reads the 101, then frames; ``on_frame`` gets each body."""

    def __init__(self, on_frame: Callable[[memoryview], None]) -> None:
        self.on_frame = on_frame
        self.buffer = bytearray()
        self.upgraded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.out: list[bytes] = []
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(ConnectionResetError("closed before the 101"))

    coalesce = True  # False (``--eager-writes``): each frame is written as it is sent

    def send(self, frame: bytes) -> None:
        """Queue a frame; every frame queued in this loop iteration goes in one write."""
        if not self.coalesce:
            self.transport.write(frame)
            return
        if not self.out:
            asyncio.get_running_loop().call_soon(self._flush)
        self.out.append(frame)

    def _flush(self) -> None:
        out, self.out = self.out, []
        self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        if not self.upgraded.done():
            self.buffer += data
            if not self._head():
                return
            data = b""
        for body in _split(self.buffer, data)[0]:
            self.on_frame(body)

    def _head(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > _HEAD_LIMIT:
                self.upgraded.set_exception(ValueError("an HTTP head over 16 KiB"))
                self.transport.close()
            return False
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        del self.buffer[: end + 4]
        status = lines[0].split(" ", 2)
        headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        headers = {name.strip().lower(): value.strip() for name, value in headers.items()}
        if status[1:2] != ["101"] or headers.get("upgrade", "").lower() != UPGRADE:
            self.upgraded.set_exception(ValueError(f"no upgrade: {lines[0]!r}"))
            self.transport.close()
            return False
        self.upgraded.set_result(None)
        return True


async def open_upgrade(
    port: int,
    path: str,
    on_frame: Callable[[memoryview], None],
    tls: ssl.SSLContext | None = None,
) -> UpgradeClient:
    """A session on 127.0.0.1:``port``: the upgrade request, then its 101 (or an error)."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(
        lambda: UpgradeClient(on_frame), "127.0.0.1", port, ssl=tls
    )
    transport.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: {UPGRADE}\r\n"
        f"Connection: Upgrade\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode("latin-1")
    )
    await protocol.upgraded
    return protocol


async def _upgrade_echo(port: int, pid: int, trips: int, depth: int) -> tuple[Figure, Figure]:
    waiting: list[asyncio.Future[None]] = []  # echoes come back in order
    index = [0]

    def on_frame(body: memoryview) -> None:
        waiting[index[0]].set_result(None)
        index[0] += 1

    protocol = await open_upgrade(port, "/session/echo", on_frame)
    frame = _frame(MESSAGE)
    loop = asyncio.get_running_loop()

    async def one() -> None:
        future = loop.create_future()
        waiting.append(future)
        protocol.send(frame)
        await future
        if index[0] > 4096 and index[0] == len(waiting):
            waiting.clear()
            index[0] = 0

    result: tuple[Figure, Figure] = await measure_pattern(pid, trips, depth, one)
    protocol.transport.close()
    return result


async def _upgrade_get(port: int, pid: int, trips: int, depth: int) -> tuple[Figure, Figure]:
    waiting: dict[int, asyncio.Future[bytes]] = {}

    def on_frame(body: memoryview) -> None:
        request_id, value = msgpack.unpackb(body)
        waiting.pop(request_id).set_result(value)

    protocol = await open_upgrade(port, "/session/get", on_frame)
    loop = asyncio.get_running_loop()
    ids = iter(range(1 << 62))

    async def get(key: str) -> bytes:
        request_id = next(ids)
        future: asyncio.Future[bytes] = loop.create_future()
        waiting[request_id] = future
        protocol.send(_frame(msgpack.packb([request_id, "get", key])))
        return await future

    async def one() -> None:
        assert await get("k") == VALUE

    result: tuple[Figure, Figure] = await measure_pattern(pid, trips, depth, one)
    protocol.transport.close()
    return result


async def _serve_session_get(port: int, pid: int, trips: int, depth: int) -> tuple[Figure, Figure]:
    """The session protocol by hand against ``aioelastic serve`` over the raw upgrade: the hello,
    then ``[REQUEST, id, "get", ["k"]]`` frames, answers matched by id (no store client)."""
    waiting: dict[int, asyncio.Future[Any]] = {}

    def on_frame(body: memoryview) -> None:
        for _kind, request_id, value in _unpack(body):
            waiting.pop(request_id).set_result(value)

    protocol = await open_upgrade(port, "/v1/session", on_frame)
    result = await _session_pattern(pid, trips, depth, waiting, protocol.send)
    protocol.transport.close()
    return result


def _unpack(body: memoryview) -> list[Any]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(body)
    return list(unpacker)


async def _session_pattern(
    pid: int,
    trips: int,
    depth: int,
    waiting: dict[int, asyncio.Future[Any]],
    send: Callable[[bytes], None],
) -> tuple[Figure, Figure]:
    """The hello, a put of ``k``, then ``get k`` round trips through ``send`` (framed bodies)."""
    loop = asyncio.get_running_loop()
    ids = iter(range(1, 1 << 62))

    async def call(rid: int, op: str, args: Any) -> Any:
        future: asyncio.Future[Any] = loop.create_future()
        waiting[rid] = future
        send(_frame(msgpack.packb([0, rid, op, args])))
        return await future

    await call(0, "hello", {"versions": [1]})
    await call(next(ids), "put", ["k", VALUE, 0])

    async def one() -> None:
        kv = await call(next(ids), "get", ["k"])
        assert kv[1] == VALUE

    result: tuple[Figure, Figure] = await measure_pattern(pid, trips, depth, one)
    return result


def _tcpstore_get(port: int, pid: int, trips: int) -> Figure:
    distributed: Any = importlib.import_module("torch.distributed")
    client = distributed.TCPStore("127.0.0.1", port, is_master=False)
    for _ in range(trips):  # warm up
        client.get("k")
    server, own, start = _server_cpu(pid), _cpu(), time.perf_counter()
    for _ in range(trips):
        client.get("k")
    elapsed = time.perf_counter() - start
    return trips / elapsed, (_server_cpu(pid) - server) / trips, (_cpu() - own) / trips


# -- the run --------------------------------------------------------------------------------------


def _run(coro: Any, loop: str) -> Any:
    factory = importlib.import_module("uvloop").new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def _start(kind: str, loop: str) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    server = {"ws": "aiohttp", "upgrade": "aiohttp", "get": "aiohttp"}.get(kind, kind)
    command = [sys.executable, "-m", "benchmarks.upgrade_floor", "--loop", loop, "--serve", server]
    if kind in ("session", "rawsession"):
        command = [sys.executable, "-m", "aioelastic", "serve", "--port", "0", "--loop", loop]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"(?:port |listening on http://127\.0\.0\.1:)(\d+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"the {kind} server did not start: {line!r}")
    return proc, int(match.group(1))


LABELS = {
    "ws": "aiohttp WebSocket echo",
    "upgrade": "upgrade + frames, echo",
    "proto": "asyncio Protocol echo",
    "get": "upgrade + frames, get",
    "session": "session get (store client)",
    "rawsession": "serve, raw upgrade, by hand",
}


def _round(kind: str, loop: str, args: argparse.Namespace) -> tuple[Figure, Figure | None]:
    proc, port = _start(kind, loop)
    try:
        if kind == "tcpstore":
            return _tcpstore_get(port, proc.pid, args.trips), None
        clients = {
            "ws": _ws_client,
            "upgrade": _upgrade_echo,
            "proto": _proto_client,
            "get": _upgrade_get,
            "session": _session_client,
            "rawsession": _serve_session_get,
        }
        seq, many = _run(clients[kind](port, proc.pid, args.trips, args.depth), loop)
        return seq, many
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=20000)  # CPU is read in 10 ms ticks
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--no-torch", action="store_true", help="skip the TCPStore row")
    parser.add_argument(
        "--eager-writes",
        action="store_true",
        help="the upgrade client writes each frame at once instead of one write per iteration",
    )
    parser.add_argument("--only", nargs="+", choices=[*LABELS, "tcpstore"], help="just these rows")
    parser.add_argument("--serve", choices=("aiohttp", "proto", "tcpstore"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    loop = args.loop
    if loop == "auto":
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    if args.serve == "tcpstore":
        _serve_tcpstore()
        return
    if args.serve:
        _run(_serve(args.serve), loop)
        return
    UpgradeClient.coalesce = not args.eager_writes
    kinds = list(LABELS)
    if not args.no_torch and importlib.util.find_spec("torch") is not None:
        kinds.append("tcpstore")
    kinds = [kind for kind in kinds if kind in (args.only or kinds)]
    runs: dict[str, tuple[list[Figure], list[Figure]]] = {k: ([], []) for k in kinds}
    for _ in range(args.repeat):
        for kind in kinds:  # alternated: every row sees the same machine
            seq, many = _round(kind, loop, args)
            runs[kind][0].append(seq)
            if many is not None:
                runs[kind][1].append(many)
    _report(runs, args, loop)


def _report(
    runs: dict[str, tuple[list[Figure], list[Figure]]], args: argparse.Namespace, loop: str
) -> None:
    print(
        f"Round trips on 127.0.0.1 ({os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}), Python {sys.version.split()[0]}, {loop} event loop, "
        f"aiohttp {aiohttp.__version__}, msgpack {msgpack.version}, {args.trips} trips, "
        f"median of {args.repeat} alternated runs"
    )
    for kind, label in LABELS.items():
        if kind not in runs:
            continue
        print(_row(f"{label}, sequential", runs[kind][0]))
        print(_row(f"{label}, {args.depth} in flight", runs[kind][1]))
    if "tcpstore" not in runs:
        return
    version = importlib.import_module("torch").__version__
    print(_row(f"TCPStore get (torch {version}), sequential", runs["tcpstore"][0]))
    tcp = statistics.median(r[0] for r in runs["tcpstore"][0])
    for kind in ("get", "session", "rawsession"):
        if kind not in runs:
            continue
        one = statistics.median(r[0] for r in runs[kind][0])
        many = statistics.median(r[0] for r in runs[kind][1])
        print(
            f"  {LABELS[kind]}: sequential {one / tcp:.2f}x TCPStore's sequential get "
            f"(target >= 0.5x), {args.depth} in flight {many / tcp:.2f}x (target >= 2x)"
        )


if __name__ == "__main__":
    main()
