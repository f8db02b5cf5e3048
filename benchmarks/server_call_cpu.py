"""The server's CPU per session request, socket-free: ``RawSession.data_received`` of one whole
message of one request (a get, a put, a small transaction) on a transport that drops what it is
given, so only the server's own Python work is in the figure (decode, dispatch, the engine,
encode, the metering, the call of the transport's write), not the system calls. The ``event``
row is the CPU per delivery of a put to one watch on each of 64 sessions (version 2; or
``--sessions``), as a round record or a member's loss reaches the members of a rendezvous: the
engine's fan-out, each connection's pump and frame, the call of its transport's write.

    PYTHONPATH=. nice -n 5 python -m benchmarks.server_call_cpu [--calls 20000] [--repeat 7] \
        [--sessions 64] [--against /path/to/other/checkout]

Prints the median and range of ``time.thread_time()`` per call over ``--repeat`` runs;
``--against`` runs the same in a subprocess on another checkout's code, alternated with this
one's (twice each), and prints the ratios of the medians. ``--instructions`` counts the event
row exactly instead (callgrind, whatever the load): the instructions per delivery, the
difference of a run of one put and one of more, each into ``--sessions`` watching sessions.

    PYTHONPATH=. python -m benchmarks.server_call_cpu --instructions --sessions 10000 \
        [--against /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class _Drop:
    """A transport that takes every write and is never full."""

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, parts: list[bytes]) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _message(*frames: list[Any]) -> bytes:
    from aioelastic.store.http._frames import pack
    from aioelastic.store.http._session_stream import message_header

    body = b"".join(pack(frame) for frame in frames)
    return message_header(len(body)) + body


async def _measure(calls: int, repeat: int, sessions: int = 64) -> dict[str, list[float]]:
    from aioelastic.store.http._frames import REQUEST
    from aioelastic.store.http._metrics import RequestMeter
    from aioelastic.store.http._session_raw import RawSession
    from aioelastic.store.http._session_server import SessionHub
    from aioelastic.store.memory import MemoryEngine

    engine = MemoryEngine()
    hub = SessionHub(engine, max_key_bytes=1024, max_value_bytes=1 << 20, max_watches=1 << 20)
    hub.observe = RequestMeter().observe  # metered, as a server with prometheus-client is
    session = RawSession(hub, lambda exc: None, _Drop())
    session.start()
    session.data_received(_message([REQUEST, 0, "hello", {"versions": [1]}]))
    engine.put("k", b"v" * 64)
    requests = {
        "get": _message([REQUEST, 1, "get", ["k"]]),
        "put": _message([REQUEST, 2, "put", ["k", b"v" * 64, 0]]),
        "txn": _message(
            [
                REQUEST,
                3,
                "txn",
                [[["k", "version", ">", 0]], [["put", "n/1", b"x" * 100, 0], ["get", "k"]], []],
            ]
        ),
    }
    out: dict[str, list[float]] = {}
    for name, message in requests.items():
        runs = []
        for _ in range(repeat):
            start = time.thread_time()
            for _ in range(calls):
                session.data_received(message)
            runs.append((time.thread_time() - start) / calls)
        out[name] = runs
    session.connection_lost(None)
    puts = max(1, calls // sessions)
    out["event"] = await _deliveries(hub, engine, puts, repeat, sessions)
    return out


async def _deliveries(
    hub: Any, engine: Any, puts: int, repeat: int, watchers: int = 64
) -> list[float]:
    """CPU per delivery of a put to one watch on each of ``watchers`` sessions."""
    from aioelastic.store.http._frames import REQUEST
    from aioelastic.store.http._session_raw import RawSession

    sessions = []
    for _ in range(watchers):
        session = RawSession(hub, lambda exc: None, _Drop())
        session.start()
        # (no progress tick within a run, however slow: callgrind's runs are 50 times slower)
        hello = {"versions": [1, 2], "progress_interval": 300.0}
        session.data_received(_message([REQUEST, 0, "hello", hello]))
        session.data_received(_message([REQUEST, 1, "watch", ["c/", None, False]]))
        sessions.append(session)
    if hub.watches != watchers:  # (a refused watch would make the figure a fraction of itself)
        raise RuntimeError(f"{hub.watches} of {watchers} watches opened")
    await asyncio.sleep(0)
    runs = []
    value = b"r" * 90  # about a round record's size
    for _ in range(repeat):
        start = time.thread_time()
        for _ in range(puts):
            engine.put("c/round", value)
            await asyncio.sleep(0)  # the connections' flushes (scheduled with call_soon)
        runs.append((time.thread_time() - start) / (puts * watchers))
    for session in sessions:
        session.connection_lost(None)
    return runs


async def _events_only(sessions: int, puts: int) -> None:
    """The event row's fan-out alone: ``puts`` puts into ``sessions`` watching sessions."""
    from aioelastic.store.http._metrics import RequestMeter
    from aioelastic.store.http._session_server import SessionHub
    from aioelastic.store.memory import MemoryEngine

    engine = MemoryEngine()
    hub = SessionHub(engine, max_key_bytes=1024, max_value_bytes=1 << 20, max_watches=1 << 20)
    hub.observe = RequestMeter().observe
    await _deliveries(hub, engine, puts, 1, sessions)


def _event_instructions(checkout: Path, sessions: int, puts: int) -> float:
    """callgrind's instructions per event delivery of ``checkout``'s code: a run of ``1 + puts``
    puts less one of 1, over ``puts * sessions`` deliveries."""
    counts = []
    for n in (1, 1 + puts):
        args = [sys.executable, __file__, "--events-child", str(n), "--sessions", str(sessions)]
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *args],
            env=dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED="0"),
            cwd=checkout,
            capture_output=True,
            text=True,
        )
        match = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode or match is None:
            raise RuntimeError(done.stderr[-800:])
        counts.append(int(match[1]))
    return (counts[1] - counts[0]) / (puts * sessions)


def _other(checkout: Path, calls: int, repeat: int, sessions: int) -> dict[str, list[float]]:
    """The figures of ``checkout``'s code, in a process of its own (this file run by path, with
    the checkout's ``aioelastic`` first on the path)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            "--calls",
            str(calls),
            "--repeat",
            str(repeat),
            "--sessions",
            str(sessions),
        ],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-500:])
    result: dict[str, list[float]] = json.loads(done.stdout)
    return result


def _line(label: str, runs: dict[str, list[float]]) -> str:
    return f"{label}: " + ", ".join(
        f"{name} {statistics.median(v) * 1e6:.2f} us ({min(v) * 1e6:.2f}-{max(v) * 1e6:.2f})"
        for name, v in runs.items()
    )


def _print_instructions(sessions: int, against: Path | None) -> None:
    sides = [ROOT] + ([against.resolve()] if against else [])
    puts = max(2, 40_000 // sessions)
    got = {side: _event_instructions(side, sessions, puts) for side in sides}
    for side, count in got.items():
        print(f"{side}: event {count:,.0f} instructions per delivery ({sessions} sessions)")
    if against:
        print(f"this / {sides[1]}: {got[ROOT] / got[sides[1]]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--sessions", type=int, default=64, help="sessions of the event row")
    parser.add_argument("--against", type=Path, help="another checkout, alternated with this")
    parser.add_argument(
        "--instructions", action="store_true", help="count the event row with callgrind"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--events-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.events_child is not None:  # (a callgrind run: no teardown counted)
        asyncio.run(_events_only(args.sessions, args.events_child))
        os._exit(0)
    if args.instructions:
        _print_instructions(args.sessions, args.against)
        return
    if args.child:  # (for --against: the figures as JSON)
        print(json.dumps(asyncio.run(_measure(args.calls, args.repeat, args.sessions))))
        return
    if args.against is None:
        print(_line(str(ROOT), asyncio.run(_measure(args.calls, args.repeat, args.sessions))))
        return
    ours: list[dict[str, list[float]]] = []
    theirs: list[dict[str, list[float]]] = []
    for _ in range(2):
        theirs.append(_other(args.against.resolve(), args.calls, args.repeat, args.sessions))
        print(_line(str(args.against), theirs[-1]), flush=True)
        ours.append(_other(ROOT, args.calls, args.repeat, args.sessions))
        print(_line(str(ROOT), ours[-1]), flush=True)
    for name in ours[0]:
        ratios = [
            statistics.median(a[name]) / statistics.median(b[name])
            for a, b in zip(ours, theirs, strict=True)
        ]
        print(f"{name}: this / other {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
