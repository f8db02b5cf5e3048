"""Server CPU per session set-up, broken down by step, over one ``aioelastic serve`` process.

K fresh connections are opened against one server, ``--concurrency`` at a time, each taken up to
a step and held open; the figure is the server process's CPU time (every thread's, from /proc's
schedstat) over the opening of the K, divided by K. Each step includes the ones before it:

- ``tcp``: the TCP connection (the accept and aiohttp's connection handler);
- ``upgrade``: + ``GET /v1/session`` with ``Upgrade: aioelastic-session/1``, answered 101;
- ``hello``: + the hello and the welcome (a session);
- ``lease``: + a ``lease_grant`` over the session (a session-bound lease);
- ``watch``: + one watch (what a participant's session has before its first join).

The difference between two steps is that step's own cost. The connections are then closed and
the server's CPU until it has settled (the session grace and the leases' revocation included)
is printed as the close cost per connection. Medians and ranges over ``--repeat`` rounds, every
step alternated within each repetition so that the machine's load weighs on all of them alike.

    PYTHONPATH=. nice -n 5 python -m benchmarks.session_setup_cpu --k 256 --repeat 5 \
        [--baseline /work/main]

``--baseline CHECKOUT`` measures a second server, started from that checkout, in the same run
(every step of both alternated within each repetition) and prints the after/before ratios.

``--profile``: instead, the server runs on a thread of this process (asyncio's loop, not the
``serve`` command's uvloop) and cProfile on that thread prints its top functions by own time over
the set-ups of the last step (``--stages``): compare the shares, not the times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aioelastic.store.http._frames import PROTOCOL_VERSIONS, REQUEST, pack
from aioelastic.store.http._session_stream import UPGRADE, message_header
from aioelastic.testing.http import ServerThread
from benchmarks.rdzv_processes import _cpu_seconds
from benchmarks.scale_http import serve_process

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("tcp", "upgrade", "hello", "lease", "watch")
#: how long the server is given to settle after the connections close (its session grace is
#: 0.25 s; the leases are revoked at its end)
SETTLE = 0.6


class Session:
    """A raw client connection, taken step by step (the client's own CPU is kept small)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int, stage: str) -> Session:
        session = cls(*await asyncio.open_connection(host, port))
        if stage == "tcp":
            return session
        request = (
            f"GET /v1/session HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\n"
            f"Upgrade: {UPGRADE}\r\n\r\n"
        )
        session.writer.write(request.encode())
        head = await session.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise RuntimeError(f"the upgrade was refused: {head[:200]!r}")
        steps: list[list[Any]] = [
            [REQUEST, 0, "hello", {"versions": list(PROTOCOL_VERSIONS), "client": "bench"}],
            [REQUEST, 1, "lease_grant", [30.0]],
            [REQUEST, 2, "watch", ["bench/", None, False]],
        ]
        for frame in steps[: STAGES.index(stage) - 1]:
            await session.call(frame)
        return session

    async def call(self, frame: list[Any]) -> bytes:
        body = pack(frame)
        self.writer.write(message_header(len(body)) + body)
        length = int.from_bytes(await self.reader.readexactly(4), "big")
        return await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def open_many(host: str, port: int, stage: str, k: int, concurrency: int) -> list[Session]:
    """K sessions taken to ``stage``, ``concurrency`` being opened at a time."""
    slots = asyncio.Semaphore(concurrency)

    async def one() -> Session:
        async with slots:
            return await Session.open(host, port, stage)

    return list(await asyncio.gather(*(one() for _ in range(k))))


async def _measure(
    host: str, port: int, cpu: Callable[[], float], stage: str, k: int, concurrency: int
) -> tuple[float, float]:
    """(server CPU seconds per set-up, per close) of one batch of K at ``stage``."""
    before = cpu()
    sessions = await open_many(host, port, stage, k, concurrency)
    opened = cpu()
    for session in sessions:
        session.close()
    await asyncio.sleep(SETTLE)
    closed = cpu()
    return (opened - before) / k, (closed - opened) / k


#: one server's figures: stage -> [(set-up, close) per connection, one per repetition]
Figures = dict[str, list[tuple[float, float]]]


class Target:
    """A server under test: its label, host and port, and a reading of its CPU seconds."""

    def __init__(self, label: str, url: str, cpu: Callable[[], float]) -> None:
        parts = urlsplit(url)
        self.label, self.cpu = label, cpu
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80


async def _run(targets: list[Target], stages: list[str], args: argparse.Namespace) -> list[Figures]:
    """Every stage on every server in turn, ``--repeat`` times (a warm-up batch each first)."""
    figures: list[Figures] = [{stage: [] for stage in stages} for _ in targets]
    for target in targets:
        for stage in stages:  # imports, first-use caches
            await _measure(target.host, target.port, target.cpu, stage, 32, args.concurrency)
    for _ in range(args.repeat):
        for target, got in zip(targets, figures, strict=True):
            for stage in stages:
                measured = await _measure(
                    target.host, target.port, target.cpu, stage, args.k, args.concurrency
                )
                got[stage].append(measured)
    return figures


def _us(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 1e6:6.0f} us "
        f"({min(values) * 1e6:.0f}-{max(values) * 1e6:.0f})"
    )


def _report(label: str, figures: Figures, args: argparse.Namespace) -> None:
    print(
        f"{label}: server CPU per connection, K={args.k} at {args.concurrency} at a time, "
        f"{args.repeat} repetitions (median (min-max))"
    )
    print(f"{'step':8} | {'set-up (cumulative)':22} | {'this step':10} | close and settle")
    previous: float | None = None
    for stage, values in figures.items():
        setup = [v[0] for v in values]
        median = statistics.median(setup)
        own = f"{(median - previous) * 1e6:6.0f} us" if previous is not None else f"{'':9}"
        print(f"{stage:8} | {_us(setup):22} | {own:10} | {_us([v[1] for v in values])}")
        previous = median
    print()


def _ratios(before: Figures, after: Figures) -> None:
    print("after / before, set-up per connection (median of the same-run ratios, min-max):")
    for stage in after:
        ratios = [a[0] / b[0] for a, b in zip(after[stage], before[stage], strict=True) if b[0] > 0]
        if ratios:
            print(
                f"  {stage:8} {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            )


@contextlib.contextmanager
def _server_process(root: Path) -> Iterator[tuple[str, Callable[[], float]]]:
    """``aioelastic serve`` from the checkout at ``root`` on a free port."""
    env = dict(os.environ, PYTHONPATH=str(root))
    with serve_process([], env, cwd=root) as (proc, url, _):
        pid = proc.pid
        yield url, lambda: _cpu_seconds(pid)


def _profile(args: argparse.Namespace, stage: str) -> None:
    profile = cProfile.Profile(time.thread_time)

    async def enable() -> None:
        profile.enable()  # cProfile hooks the thread that enables it: the server's

    async def disable() -> None:
        profile.disable()

    with ServerThread() as server:
        parts = urlsplit(server.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80

        async def batches(count: int) -> None:
            for _ in range(count):
                for session in await open_many(host, port, stage, args.k, args.concurrency):
                    session.close()
                await asyncio.sleep(SETTLE)

        asyncio.run(batches(1))  # warm-up
        server.call(enable())
        asyncio.run(batches(args.repeat))
        server.call(disable())
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=256, help="connections per batch")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16, help="being opened at a time")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"of {','.join(STAGES)}")
    parser.add_argument("--profile", action="store_true", help="the server's top functions")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="also measure the server of this checkout (e.g. /work/main), alternated in one run",
    )
    args = parser.parse_args()
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {','.join(STAGES)}")
    if args.profile:
        _profile(args, stages[-1])
        return
    roots = [("after", ROOT)]
    if args.baseline is not None:
        roots.insert(0, ("before", Path(args.baseline).resolve()))
    with contextlib.ExitStack() as stack:
        targets = [
            Target(label, *stack.enter_context(_server_process(root))) for label, root in roots
        ]
        print(", ".join(f"{label}: {root}" for label, root in roots))
        figures = asyncio.run(_run(targets, stages, args))
    for target, got in zip(targets, figures, strict=True):
        _report(target.label, got, args)
    if len(figures) == 2:
        _ratios(*figures)


if __name__ == "__main__":
    main()
