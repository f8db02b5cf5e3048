"""The HTTP store client's CPU per call, layer by layer, against ``aioelastic serve``.

    PYTHONPATH=. nice -n 5 python benchmarks/client_call_cpu.py [--ops 3000] [--repeat 5]
        [--against /path/to/other/checkout] [--loop auto|asyncio|uvloop]

The server is a subprocess (its own core); each round is a fresh client process that measures
its own thread's CPU (``time.thread_time()``) over ``--ops`` calls of each row, and the
server's CPU over the same span (``/proc/PID/stat``). A row names an operation and the layer it
enters at:

- ``conn``: ``Connection`` only: an id, a future tracked by the connection's pending requests,
  the frame sent (``Connection.send``), the answer dispatched to the future;
- ``session``: ``SessionClient.call`` (the session's limits, retries and error mapping);
- ``core``: the backend's core method (``HttpStore._get``, ``_put``, ``_txn``), no validation;
- ``public``: the public ``Store`` method (``store.get``...), as users call it.

The difference between two layers is what the upper one adds. ``in flight`` rows run 64 tasks
on one store (the pipelined case). With ``--against DIR`` the rounds alternate between this
checkout's client and the one in ``DIR`` (the same server), so before/after figures come from
one run: the columns show the median and range of the rounds, in µs per operation.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Call = Callable[[int], Awaitable[Any]]


def _server_cpu(pid: int) -> float:
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(
    call: Call, ops: int, pid: int, depth: int = 1, count: Any = None, warm: int = 200
) -> tuple[float, float]:
    """(client µs/op, server µs/op) over ``ops`` calls, ``depth`` at once (``count``: a
    :class:`FakeTransport` whose writes are counted from the end of the warm-up on)."""
    for i in range(warm):
        await call(i)
    if count is not None:
        count.writes = 0
    server = _server_cpu(pid)
    start = time.thread_time()
    if depth == 1:
        for i in range(ops):
            await call(i)
    else:

        async def worker(first: int) -> None:
            for i in range(first, ops, depth):
                await call(i)

        await asyncio.gather(*(worker(n) for n in range(depth)))
    client = time.thread_time() - start
    server = _server_cpu(pid) - server
    return client / ops * 1e6, server / ops * 1e6


def _rows(store: Any) -> dict[str, Call]:
    """Every measured row of one client: name -> one call (``i``: the call's number)."""
    from aioelastic.store import Compare, Put
    from aioelastic.store.http._frames import REQUEST
    from aioelastic.store.http._txn_wire import txn_to_frame

    session = store.session
    value = b"x" * 64
    txn_args: dict[str, Any] = {
        "compare": [Compare.version("t/k") < 1 << 40],
        "success": [Put("t/k", value)],
    }
    checked = _check_txn(txn_args)
    txn_frame = txn_to_frame(checked)

    async def conn_call(op: str, args: list[Any], write: bool) -> Any:
        conn = session._conn or await session.connection()
        rid = session._take_id()
        if hasattr(conn, "request"):
            if "write" in inspect.signature(conn.request).parameters:  # (before 2026-12-03)
                return await conn.request(rid, op, args, write, 30.0)
            return await conn.request(rid, op, args, 30.0)
        future = conn.loop.create_future()  # (a client from before Connection.request)
        conn.pending.track(rid, future, write, 30.0)
        conn.send([REQUEST, rid, op, args])
        return await future

    lease = {"id": 0}

    async def keep_alive(i: int) -> Any:
        if not lease["id"]:
            lease["id"] = (await store.lease_grant(60)).id
        return await store.lease_keep_alive(lease["id"])

    return {
        "get conn": lambda i: conn_call("get", ["g/k"], False),
        "get session": lambda i: session.call("get", ["g/k"], write=False, what="get"),
        "get core": lambda i: store._get("g/k"),
        "get public": lambda i: store.get("g/k"),
        "put conn": lambda i: conn_call("put", ["p/k", value, 0], True),
        "put session": lambda i: session.call("put", ["p/k", value, 0], write=True, what="put"),
        "put core": lambda i: store._put("p/k", value, 0),
        "put public": lambda i: store.put("p/k", value),
        "txn session": lambda i: session.call("txn", txn_frame, write=True, what="txn"),
        "txn core": lambda i: store._txn(checked),
        "txn public": lambda i: store.txn(**txn_args),
        "cas public": lambda i: store.compare_and_swap("c/k", 0, value),
        "add public": lambda i: store.add("a/k", 1),
        "keep_alive public": keep_alive,
    }


def _check_txn(txn_args: dict[str, Any]) -> Any:
    from aioelastic.store._txn import check_txn

    return check_txn(txn_args["compare"], txn_args["success"], ())


async def _watched_put(store: Any, ops: int, pid: int) -> tuple[float, float]:
    """A put and its event through a watch of the same store (µs per put + event)."""
    value = b"x" * 64
    async with store.watch("w/") as events:

        async def call(i: int) -> None:
            await store.put("w/k", value)
            await events.__anext__()

        return await _measure(call, ops, pid)


class FakeTransport:
    """A transport that answers every request frame written to it with a canned answer, one
    loop turn later (as a server's read would come), in one message per write. Its own work
    (cutting the requests, building the answers) is timed and subtracted (``spent``)."""

    def __init__(self, conn: Any) -> None:
        import msgpack

        from aioelastic.store._types import KeyValue
        from aioelastic.store.http._frames import kv_to_wire
        from aioelastic.store.http._txn_wire import result_to_frame

        self.conn = conn
        self.writes = 0
        self.last = b""
        self._unpacker = msgpack.Unpacker(raw=False)
        self._pack = msgpack.Packer(use_bin_type=True).pack
        kv = KeyValue("g/k", b"x" * 64, 1, 1, 1, 0)
        txn_result = _canned_txn_result()
        canned = {
            "get": kv_to_wire(kv),
            "put": 5,
            "txn": result_to_frame(txn_result),
            "cas": [True, 5, None],
            "add": 5,
            "lease_grant": [7, 60.0],
            "lease_keep_alive": 60.0,
        }
        self._answers = {op: self._pack(value) for op, value in canned.items()}
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.last = data
        self._loop.call_soon(self.conn.data_received, self.answer(data))

    def answer(self, data: bytes) -> bytes:
        """The message answering the request message ``data``."""
        unpacker = self._unpacker
        unpacker.feed(memoryview(data)[4:])
        pack = self._pack
        answers = self._answers
        body = b"".join([b"\x93\x01" + pack(frame[1]) + answers[frame[2]] for frame in unpacker])
        return len(body).to_bytes(4, "big") + body

    def own_cost(self, writes: int) -> float:
        """The CPU seconds that ``writes`` answers to the last request cost the fake."""
        data, answer = self.last, self.answer
        started = time.thread_time()
        for _ in range(writes):
            answer(data)
        return time.thread_time() - started

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


def _canned_txn_result() -> Any:
    from aioelastic.store._txn import PutResult, TxnResult
    from aioelastic.store._types import KeyValue

    return TxnResult(True, 5, (PutResult(KeyValue("t/k", b"x" * 64, 1, 5, 2, 0)),))


async def _batches(call: Call, ops: int, fake: FakeTransport, depth: int) -> tuple[float, float]:
    """(client µs/op, the fake's µs/op) of the fastest of 20 batches of ``ops / 20`` calls:
    on a shared machine other work only ever adds to a batch's CPU (caches, a sibling
    hyperthread), so the fastest batch is the closest to the code's own cost."""
    size = max(depth, ops // 20 // depth * depth)
    clients, fakes = [], []
    for _ in range(20):
        client, _ = await _measure(call, size, 0, depth=depth, count=fake, warm=20)
        clients.append(client)
        fakes.append(fake.own_cost(fake.writes) / size * 1e6)
    fake_us = min(fakes)
    return min(clients) - fake_us, fake_us


async def _socket_free(ops: int) -> dict[str, tuple[float, float]]:
    """Every row against a :class:`FakeTransport` (client CPU only, the fastest batch; the
    second figure is the fake's own share per call, measured by replaying its answers, already
    subtracted)."""
    from aioelastic.store.http import HttpStore
    from aioelastic.store.http._client_conn import MAX_MESSAGE, Connection
    from aioelastic.store.http._session_stream import MessageReader

    store = HttpStore("http://127.0.0.1:1", max_connections=0)
    session = store.session
    conn = Connection(asyncio.get_running_loop())
    fake = FakeTransport(conn)
    conn.transport = fake  # type: ignore[assignment]
    conn._answer = None
    conn._messages = MessageReader(MAX_MESSAGE)
    conn.attach(session._lost, 4 << 20)
    session._conn = conn
    out: dict[str, tuple[float, float]] = {}
    try:
        rows = _rows(store)
        rows["get public, 64 in flight"] = lambda i: store.get("g/k")
        for name, call in rows.items():
            out[name] = await _batches(call, ops, fake, 64 if "in flight" in name else 1)
    finally:
        session._conn = None
        store._closed = True
    return out


async def _child(url: str, pid: int, ops: int) -> dict[str, tuple[float, float]]:
    from aioelastic.store import open_store

    out: dict[str, tuple[float, float]] = {}
    for name, figures in (await _socket_free(ops)).items():
        out[f"{name} (no socket)"] = figures
    async with open_store(url, max_connections=0) as store:
        await store.put("g/k", b"x" * 64)
        for name, call in _rows(store).items():
            out[name] = await _measure(call, ops, pid)
        out["get public, 64 in flight"] = await _measure(
            lambda i: store.get("g/k"), ops, pid, depth=64
        )
        out["put + watch event public"] = await _watched_put(store, ops, pid)
    return out


def _run(coro: Any, loop: str) -> Any:
    factory = importlib.import_module("uvloop").new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def _round(code: Path, url: str, pid: int, args: argparse.Namespace, loop: str) -> Any:
    env = dict(os.environ, PYTHONPATH=str(code))
    child = [sys.executable, __file__, "--child", url, str(pid), "--ops", str(args.ops)]
    done = subprocess.run(
        [*child, "--loop", loop], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"a client round failed ({code}):\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} [{min(values):5.1f}-{max(values):5.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=3000, help="calls per row and round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per checkout")
    parser.add_argument("--against", type=Path, help="another checkout, alternated (before)")
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--child", nargs=2, metavar=("URL", "PID"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    loop = args.loop
    if loop == "auto":
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    if args.child:
        url, pid = args.child
        print(json.dumps(_run(_child(url, int(pid), args.ops), loop)))
        return

    sys.path.insert(0, str(ROOT))
    from benchmarks.http_ops import start_server, stop_server

    codes = [ROOT] + ([args.against.resolve()] if args.against else [])
    proc, url = start_server("--loop", loop)
    results: dict[Path, list[dict[str, list[float]]]] = {code: [] for code in codes}
    try:
        for _ in range(args.repeat):
            for code in codes:
                results[code].append(_round(code, url, proc.pid, args, loop))
    finally:
        stop_server(proc)
    print(
        f"HTTP store client CPU per call (µs, thread_time; server µs from /proc), {loop} loop, "
        f"{args.ops} calls per row, median [range] of {args.repeat} rounds, load average "
        f"{os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}"
    )
    header = "".join(f"  | {str(code)[-28:]:>28} client, server" for code in codes)
    print(f"{'row':<28}{header}")
    for name in results[ROOT][0]:
        cells = []
        for code in codes:
            rounds = results[code]
            client = [r[name][0] for r in rounds if name in r]
            server = [r[name][1] for r in rounds if name in r]
            cells.append(f"  | {_cell(client)}, {statistics.median(server):5.1f}" if client else "")
        print(f"{name:<28}{''.join(cells)}")
    if len(codes) == 2:
        print(f"ratio this/against (client medians), {codes[0]} / {codes[1]}:")
        for name in results[ROOT][0]:
            mine = statistics.median(r[name][0] for r in results[ROOT])
            theirs = statistics.median(r[name][0] for r in results[codes[1]])
            print(f"  {name:<28} {mine / theirs:.2f}")


if __name__ == "__main__":
    main()
