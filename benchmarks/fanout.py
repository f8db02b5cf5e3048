"""Watch fan-out over http: one put seen by 1,000 watchers, this checkout against another.

    PYTHONPATH=. nice -n 5 python benchmarks/fanout.py [--against /path/to/other/checkout]
        [--watchers 1000] [--sessions 1,10] [--rounds 10] [--repeat 3] [--loop auto]

Each round starts ``aioelastic serve`` from one checkout (a subprocess: its own core) and a
fresh client process from the same checkout, which opens ``--watchers`` watches of one prefix
spread over each number of ``--sessions`` (reader stores), then, ``--rounds`` times: a task
waiting on each watch (``http_ops.py``'s fan-out rows do the same), one put from a writer store,
and the time until the last watcher has it. With ``--against DIR`` the rounds alternate between
this checkout and ``DIR`` (before/after from one run on one machine). Printed per checkout and
layout: the latency (median and range of every put of every round), the client's CPU per
delivery (``time.thread_time()`` from the put until the last watcher has it) and the server's
(``/proc/PID/schedstat`` over the puts), medians and ranges of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _server_cpu(pid: int) -> float:
    """The server's CPU seconds: from ``/proc/PID/schedstat`` (nanoseconds; ``stat``'s clock
    ticks are 10 ms, a coarse figure for a round of a few milliseconds) where there is one."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one_put(writer: Any, watches: list[Any], value: bytes) -> tuple[float, float]:
    """(seconds, client CPU seconds) from one put until the last of ``watches`` has it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[float, float]] = loop.create_future()
    remaining = len(watches)

    async def one(watch: Any) -> None:
        nonlocal remaining
        await watch.__anext__()
        remaining -= 1
        if remaining == 0:
            done.set_result((time.perf_counter(), time.thread_time()))

    tasks = [asyncio.ensure_future(one(w)) for w in watches]
    await asyncio.sleep(0.1)  # every watcher waiting
    start, cpu = time.perf_counter(), time.thread_time()
    await writer.put("fan/key", value)
    end, end_cpu = await asyncio.wait_for(done, 30)
    await asyncio.gather(*tasks)
    return end - start, end_cpu - cpu


async def _layout(url: str, pid: int, watchers: int, sessions: int, rounds: int) -> Any:
    from aioelastic.store import open_store

    readers = [await open_store(url, progress_interval=30) for _ in range(sessions)]
    try:
        async with open_store(url) as writer:
            watches = [readers[i % sessions].watch("fan/") for i in range(watchers)]
            for i in range(0, watchers, 100):
                await asyncio.gather(*(w.start() for w in watches[i : i + 100]))
            await _one_put(writer, watches, b"warm")
            latencies, client, server = [], 0.0, 0.0
            for r in range(rounds):
                before = _server_cpu(pid)
                seconds, cpu = await _one_put(writer, watches, str(r).encode())
                server += _server_cpu(pid) - before
                latencies.append(seconds * 1e3)
                client += cpu
            for watch in watches:
                await watch.aclose()
    finally:
        for reader in readers:
            await reader.aclose()
    deliveries = watchers * rounds
    return {
        "ms": latencies,
        "client": client / deliveries * 1e6,
        "server": server / deliveries * 1e6,
    }


class _Recorder:
    """A server connection's sender that keeps the bytes of each message it writes."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    def write(self, parts: list[bytes]) -> None:
        from aioelastic.store.http._session_stream import message_header

        body = b"".join(parts)
        self.messages.append(message_header(len(body)) + body)

    def buffered(self) -> int:
        return 0

    def close(self, code: str, error: bytes, *, abort: bool = False) -> None:
        raise RuntimeError(f"the connection was closed: {code}")


class _NoTransport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


async def _socket_free(watchers: int, rounds: int) -> dict[str, Any]:
    """The fan-out without sockets, in this process: the server's side (a session hub's
    connection with ``watchers`` watches: the put and the pump, into memory) and the client's
    (a session connection fed those very messages, a task waiting on each watch), CPU per
    delivery (``time.thread_time()``), the fastest of ``rounds`` (others only ever add)."""
    from aioelastic.store.http import HttpStore
    from aioelastic.store.http._client_conn import MAX_MESSAGE, Connection
    from aioelastic.store.http._frames import PROTOCOL_VERSIONS, REQUEST, pack
    from aioelastic.store.http._session_server import SessionHub
    from aioelastic.store.http._session_stream import MessageReader
    from aioelastic.store.http.client import SessionWatch
    from aioelastic.store.memory import MemoryEngine

    engine = MemoryEngine()
    hub = SessionHub(engine, max_key_bytes=100, max_value_bytes=1000, max_watches=watchers)
    sender = _Recorder()
    hello = pack([REQUEST, 0, "hello", {"versions": list(PROTOCOL_VERSIONS)}])
    served = hub.greet(sender, hello)
    assert served is not None
    opens = (pack([REQUEST, i, "watch", ["fan/", None, False]]) for i in range(1, watchers + 1))
    served.received([b"".join(opens)])
    conn = Connection(asyncio.get_running_loop())
    conn.transport = _NoTransport()  # type: ignore[assignment]
    conn._answer = None  # as after the upgrade's 101
    conn._messages = MessageReader(MAX_MESSAGE)
    conn.attach(lambda conn: None, 4 << 20)
    store = HttpStore("http://127.0.0.1:1")
    watches = []
    for wid in range(1, watchers + 1):
        watch = SessionWatch(store, "fan/", None)
        watch._started = True
        watch._start_revision = watch._next_revision = 1
        conn.watches[wid] = watch
        watches.append(watch)
    server, client = [], []
    messages = 0
    for r in range(rounds):
        sender.messages.clear()
        started = time.thread_time()
        engine.put("fan/key", str(r).encode())
        served._flush()  # (what the loop would call next)
        server.append(time.thread_time() - started)
        messages, cpu = await _deliver(conn, watches, sender.messages)
        client.append(cpu)
    served.end()
    per = 1e6 / watchers
    return {"server": min(server) * per, "client": min(client) * per, "messages": messages}


async def _deliver(conn: Any, watches: list[Any], messages: list[bytes]) -> tuple[int, float]:
    """(messages, client CPU seconds) from the first message until every watcher has its event."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    remaining = len(watches)

    async def one(watch: Any) -> None:
        nonlocal remaining
        await watch.__anext__()
        remaining -= 1
        if remaining == 0:
            done.set_result(time.thread_time())

    tasks = [asyncio.ensure_future(one(w)) for w in watches]
    await asyncio.sleep(0)
    started = time.thread_time()
    for message in messages:
        conn.data_received(message)
    end = await done
    await asyncio.gather(*tasks)
    return len(messages), end - started


async def _child(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    out = {str(n): await _layout(url, pid, args.watchers, n, args.rounds) for n in args.sessions}
    out["socket-free"] = await _socket_free(args.watchers, 20)
    return out


def _serve(code: Path, loop: str) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "aioelastic", "serve", "--port", "0", "--loop", loop],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (\S+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"the server of {code} did not start: {line}")
    return proc, match.group(1)


def _round(code: Path, args: argparse.Namespace, loop: str) -> dict[str, Any]:
    proc, url = _serve(code, loop)
    try:
        env = dict(os.environ, PYTHONPATH=str(code))
        child = [sys.executable, __file__, "--child", url, str(proc.pid), "--loop", loop]
        child += ["--watchers", str(args.watchers), "--rounds", str(args.rounds)]
        child += ["--sessions", ",".join(map(str, args.sessions))]
        done = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"a client round failed ({code}):\n{done.stderr}")
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} [{min(values):5.1f}-{max(values):6.1f}]"


def _report(codes: list[Path], results: dict[Path, list[dict[str, Any]]], args: Any) -> None:
    for code in codes:
        print(f"{code}:")
        for n in args.sessions:
            rounds = [r[str(n)] for r in results[code]]
            ms = [x for r in rounds for x in r["ms"]]
            where = "1 session" if n == 1 else f"{n} sessions"
            print(
                f"  1 put -> {args.watchers} watchers ({where:>11}): {_spread(ms)} ms   "
                f"CPU/delivery client {_spread([r['client'] for r in rounds])} us, "
                f"server {_spread([r['server'] for r in rounds])} us"
            )
    print(
        "socket-free, one connection: CPU per delivery, the fastest of 20 puts (median [range] "
        "of the rounds), and the messages one put is"
    )
    for code in codes:
        rounds = [r["socket-free"] for r in results[code]]
        print(
            f"  {str(code)[-40:]:>40}: server {_spread([r['server'] for r in rounds])} us, "
            f"client {_spread([r['client'] for r in rounds])} us, "
            f"{rounds[0]['messages']} messages"
        )
    if len(codes) == 2:
        print(f"ratio {codes[0]} / {codes[1]} (medians):")
        for n in args.sessions:
            mine, theirs = ([r[str(n)] for r in results[code]] for code in codes)
            line = []
            for what in ("ms", "client", "server"):
                a = [x for r in mine for x in (r[what] if what == "ms" else [r[what]])]
                b = [x for r in theirs for x in (r[what] if what == "ms" else [r[what]])]
                line.append(f"{what} {statistics.median(a) / statistics.median(b):.2f}")
            print(f"  {n} session(s): {', '.join(line)}")
        mine, theirs = ([r["socket-free"] for r in results[code]] for code in codes)
        free = []
        for what in ("server", "client"):
            ours = statistics.median(r[what] for r in mine)
            free.append(f"{what} {ours / statistics.median(r[what] for r in theirs):.2f}")
        print(f"  socket-free: {', '.join(free)}")


def _run(coro: Any, loop: str) -> Any:
    factory = None
    if loop == "uvloop":
        factory = importlib.import_module("uvloop").new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument(
        "--sessions", type=lambda s: [int(n) for n in s.split(",")], default=[1, 10]
    )
    parser.add_argument("--rounds", type=int, default=10, help="puts per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per checkout")
    parser.add_argument("--against", type=Path, help="another checkout, alternated (before)")
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--child", nargs=2, metavar=("URL", "PID"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    loop = args.loop
    if loop == "auto":
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    if args.child:
        url, pid = args.child
        print(json.dumps(_run(_child(url, int(pid), args), loop)))
        return
    codes = [ROOT] + ([args.against.resolve()] if args.against else [])
    results: dict[Path, list[dict[str, Any]]] = {code: [] for code in codes}
    for _ in range(args.repeat):
        for code in codes:
            results[code].append(_round(code, args, loop))
    print(
        f"watch fan-out over http, {loop} loop, {args.rounds} puts per round, {args.repeat} "
        f"rounds per checkout, load average {os.getloadavg()[0]:.1f}, Python "
        f"{sys.version.split()[0]}; latency: every put; CPU: median [range] of the rounds"
    )
    _report(codes, results, args)


if __name__ == "__main__":
    main()
