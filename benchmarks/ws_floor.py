"""The transport floor under the session: round trips of a tiny message on loopback, through
aiohttp's WebSocket (server and client) and through a bare asyncio Protocol, in one run.

    PYTHONPATH=. python benchmarks/ws_floor.py [--trips 5000] [--depth 64] [--repeat 3]

Each server is a subprocess (``--serve ws|proto``) that echoes every message it reads, so the
server and the client have a core each. For each transport the client does ``--trips`` round
trips one at a time, then the same number with ``--depth`` messages in flight (each sent alone,
as independent callers would; the server echoes whatever it read in one write). Printed: round
trips/s and the CPU per round trip of the server process and of the client process (CPU time,
which barely depends on what else the machine runs), median of ``--repeat`` alternated runs.

This is what no change of ours above the transport can beat: the session's sequential get costs
at least the ``ws`` row, and the ``proto`` row is what dropping aiohttp's WebSocket for a raw
socket protocol could gain at most. The ``session get`` rows are the store itself (``get`` of a
64-byte value from ``aioelastic serve``, same pattern), so the three are from one run. Both
sides use uvloop when it is installed (``--loop``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from aioelastic.store import open_store

ROOT = Path(__file__).resolve().parent.parent
MESSAGE = b"\x94\x00\x01\xa3get\x91\xa5key/1"  # a get request frame's size (msgpack)


# -- servers (run in the subprocess) --------------------------------------------------------------


async def _ws_echo(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(compress=False)
    await ws.prepare(request)
    async for message in ws:
        if message.type is aiohttp.WSMsgType.BINARY:
            await ws.send_bytes(message.data)
    return ws


class _EchoProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport  # uvloop's transports are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


async def _serve(kind: str) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    if kind == "ws":
        app = web.Application()
        app.router.add_get("/ws", _ws_echo)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        print(f"port {port}", flush=True)
        await stop
        await runner.cleanup()
    else:
        server = await loop.create_server(_EchoProtocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        print(f"port {port}", flush=True)
        await stop
        server.close()


# -- clients --------------------------------------------------------------------------------------


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Figure = tuple[float, float, float]  # trips/s, server CPU s/trip, client CPU s/trip


async def _measure(pid: int, trips: int, body: Any) -> Figure:
    loop = asyncio.get_running_loop()
    server, client, start = _server_cpu(pid), _cpu(), loop.time()
    await body()
    elapsed = loop.time() - start
    return (
        trips / elapsed,
        (_server_cpu(pid) - server) / trips,
        (_cpu() - client) / trips,
    )


async def measure_pattern(
    pid: int, trips: int, depth: int, one: Callable[[], Awaitable[Any]]
) -> tuple[Figure, Figure]:
    """``one()`` round trip ``trips`` times in a row, then ``depth`` at a time (after a warm-up
    pass): the sequential and the in-flight figures."""

    async def sequential() -> None:
        for _ in range(trips):
            await one()

    async def in_flight() -> None:
        async def worker() -> None:
            for _ in range(trips // depth):
                await one()

        await asyncio.gather(*(worker() for _ in range(depth)))

    await sequential()  # warm up
    seq = await _measure(pid, trips, sequential)
    many = await _measure(pid, trips // depth * depth, in_flight)
    return seq, many


async def _ws_client(port: int, pid: int, trips: int, depth: int) -> tuple[Figure, Figure]:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{port}/ws", compress=0, autoping=True) as ws,
    ):
        waiting: deque[asyncio.Future[None]] = deque()

        async def read() -> None:
            async for message in ws:
                if message.type is aiohttp.WSMsgType.BINARY:
                    waiting.popleft().set_result(None)

        reader = asyncio.ensure_future(read())

        async def one() -> None:
            future = asyncio.get_running_loop().create_future()
            waiting.append(future)
            await ws.send_bytes(MESSAGE)
            await future

        figures = await measure_pattern(pid, trips, depth, one)
        reader.cancel()
        return figures


class _ClientProtocol(asyncio.Protocol):
    """Echoed messages are the same size, so a byte count says how many came back."""

    def __init__(self) -> None:
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.pending = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport  # uvloop's transports are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.pending += len(data)
        while self.pending >= len(MESSAGE):
            self.pending -= len(MESSAGE)
            self.waiting.popleft().set_result(None)


async def _proto_client(port: int, pid: int, trips: int, depth: int) -> tuple[Figure, Figure]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(_ClientProtocol, "127.0.0.1", port)

    async def one() -> None:
        future = loop.create_future()
        protocol.waiting.append(future)
        transport.write(MESSAGE)
        await future

    figures = await measure_pattern(pid, trips, depth, one)
    transport.close()
    return figures


async def _session_client(port: int, pid: int, trips: int, depth: int) -> tuple[Figure, Figure]:
    """The same pattern through the store: ``get`` of a 64-byte value on ``aioelastic serve``."""
    async with open_store(f"http://127.0.0.1:{port}", max_connections=0) as store:
        await store.put("k", b"x" * 64)

        async def one() -> None:
            await store.get("k")

        return await measure_pattern(pid, trips, depth, one)


# -- the run --------------------------------------------------------------------------------------


def _run(coro: Any, loop: str) -> Any:
    factory = importlib.import_module("uvloop").new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def _start(kind: str, loop: str) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    command = [sys.executable, __file__, "--loop", loop, "--serve", kind]
    if kind == "session":
        command = [sys.executable, "-m", "aioelastic", "serve", "--port", "0", "--loop", loop]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    match = re.search(r"(?:port |listening on http://127\.0\.0\.1:)(\d+)", proc.stdout.readline())
    if not match:
        proc.kill()
        raise SystemExit(f"the {kind} echo server did not start")
    return proc, int(match.group(1))


def _row(name: str, runs: list[Figure]) -> str:
    rate = statistics.median(r[0] for r in runs)
    server = statistics.median(r[1] for r in runs) * 1e6
    client = statistics.median(r[2] for r in runs) * 1e6
    spread = ", ".join(f"{r[0]:,.0f}" for r in runs)
    return (
        f"  {name:<30} {rate:>8,.0f} trips/s   CPU/trip: server {server:.0f} us, "
        f"client {client:.0f} us   (runs: {spread})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=5000)
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--serve", choices=("ws", "proto"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    loop = args.loop
    if loop == "auto":
        try:
            importlib.import_module("uvloop")
            loop = "uvloop"
        except ImportError:
            loop = "asyncio"
    if args.serve:
        _run(_serve(args.serve), loop)
        return
    clients = {"ws": _ws_client, "proto": _proto_client, "session": _session_client}
    runs: dict[str, tuple[list[Figure], list[Figure]]] = {k: ([], []) for k in clients}
    for _ in range(args.repeat):
        for kind, client in clients.items():  # alternated: both see the same machine
            proc, port = _start(kind, loop)
            try:
                seq, many = _run(client(port, proc.pid, args.trips, args.depth), loop)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
            runs[kind][0].append(seq)
            runs[kind][1].append(many)
    print(
        f"Round trips of a {len(MESSAGE)}-byte message on 127.0.0.1 ({os.cpu_count()} CPUs, load "
        f"average {os.getloadavg()[0]:.1f}), Python {sys.version.split()[0]}, {loop} event loop, "
        f"aiohttp {aiohttp.__version__}, median of {args.repeat} runs"
    )
    labels = {"ws": "aiohttp WebSocket", "proto": "asyncio Protocol", "session": "session get"}
    for kind, (seq, many) in runs.items():
        print(_row(f"{labels[kind]}, sequential", seq))
        print(_row(f"{labels[kind]}, {args.depth} in flight", many))


if __name__ == "__main__":
    main()
