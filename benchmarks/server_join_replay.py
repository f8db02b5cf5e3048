"""The server's Python work per warm join, exactly: a recorded round of N processes, replayed.

``--record FILE`` runs ``aioelastic serve`` with every session read recorded (each
``RawSession.data_received`` and ``connection_lost``, in order) and N node processes of
:mod:`benchmarks.server_join_procs` (one first round, then ``--warm`` more, each warm round
marked). ``--replay FILE`` feeds the recording to this checkout's server code, socket-free: the
session hub of ``make_app`` over a fresh engine, transports that drop what they are given, one
loop turn per read (uvloop when installed); the engine's revisions and lease ids come out as they
did, so each request meets the state it met. It prints the CPU per warm join (``thread_time``:
the Python work only, no system calls; noisy on a loaded machine). ``--instructions`` runs that
replay under callgrind twice, whole and up to the first warm round (the same code path, the
interpreter's teardown left out), and prints the difference per warm join: the same figure for
the same code whatever the load (about 40 s a run). ``--against DIR`` replays with another
checkout's code as well, in the same way.

    PYTHONPATH=. python -m benchmarks.server_join_replay --record /tmp/round.jsonl [--n 64]
    PYTHONPATH=. python -m benchmarks.server_join_replay --replay /tmp/round.jsonl \\
        [--instructions] [--against /path/to/other/checkout]

The figure is the Python side of ``server_join_procs``'s server CPU (whose other part, the
kernel's, is the system calls: its writes and reads per join).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.server_call_cpu import _Drop

ROOT = Path(__file__).resolve().parents[1]

#: ``aioelastic`` with its session reads recorded to argv[1]; SIGUSR1 and SIGUSR2 mark a warm
#: round's start and end
RECORDER = r"""
import base64, itertools, json, signal, sys
from aioelastic.store.http import _session_raw
from aioelastic.cli import main
out, serial, raw = open(sys.argv[1], "w"), itertools.count(), _session_raw.RawSession
init, received, lost = raw.__init__, raw.data_received, raw.connection_lost
def _init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self._replay_id = next(serial)
def _received(self, data):
    out.write(json.dumps(["D", self._replay_id, base64.b64encode(bytes(data)).decode()]) + "\n")
    return received(self, data)
def _lost(self, exc):
    out.write(json.dumps(["L", self._replay_id]) + "\n")
    return lost(self, exc)
raw.__init__, raw.data_received, raw.connection_lost = _init, _received, _lost
signal.signal(signal.SIGUSR1, lambda *_: (out.write('["MARK"]\n'), out.flush()))
signal.signal(signal.SIGUSR2, lambda *_: (out.write('["END"]\n'), out.flush()))
sys.exit(main(sys.argv[2:]))
"""


def record(path: Path, n: int, warm: int) -> None:
    from benchmarks.scale_http import serve_process
    from benchmarks.server_join_procs import _env, _nodes, _round

    command = [sys.executable, "-c", RECORDER, str(path)]
    with (
        serve_process([], _env(ROOT), cwd=ROOT, command=command) as (proc, url, _),
        _nodes(ROOT, url, n) as nodes,
    ):
        _round(proc.pid, url, nodes)
        for _ in range(warm):
            time.sleep(0.2)  # (the scrapes of _round and the keep-alives fall outside)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            _round(proc.pid, url, nodes)
            time.sleep(0.2)
            proc.send_signal(signal.SIGUSR2)
            time.sleep(0.2)
    print(f"recorded {warm} warm rounds of {n} to {path}")


#: The progress interval each replayed hello asks for (the server's longest): the watches'
#: progress ticks are the clock's work, not a join's, and a replay under callgrind runs long
#: enough for the recorded 2 s ticks to fire (more often the slower the machine).
REPLAY_PROGRESS_INTERVAL = 300.0


def _segments(path: Path) -> list[list[list[Any]]]:
    """The recording cut at its marks: set-up, warm round, between, warm round, ..."""
    segments: list[list[list[Any]]] = [[]]
    greeted: set[int] = set()
    for line in path.read_text().splitlines():
        item = json.loads(line)
        if item[0] in ("MARK", "END"):
            segments.append([])
        else:
            if item[0] == "D":
                item[2] = base64.b64decode(item[2])
                if item[1] not in greeted:
                    greeted.add(item[1])
                    item[2] = _slow_ticks(item[2])
            segments[-1].append(item)
    return segments


def _slow_ticks(data: bytes) -> bytes:
    """A session's first read with its hello's progress interval set to
    :data:`REPLAY_PROGRESS_INTERVAL` (the rest as it was)."""
    import msgpack

    length = int.from_bytes(data[:4], "big")
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data[4 : 4 + length])
    try:
        frames = list(unpacker)
    except ValueError:  # (not msgpack: replayed as it came)
        return data
    hello = frames[0] if frames else None
    if not (isinstance(hello, list) and len(hello) == 4 and isinstance(hello[3], dict)):
        return data
    hello[3]["progress_interval"] = REPLAY_PROGRESS_INTERVAL
    body = b"".join(msgpack.packb(frame, use_bin_type=True) for frame in frames)
    return len(body).to_bytes(4, "big") + body + data[4 + length :]


async def _replay(segments: list[list[list[Any]]], joins: int, engine: Any = None) -> list[float]:
    """CPU seconds per join of each warm round (odd segments), replayed into ``engine`` (a new
    ``MemoryEngine`` if None)."""
    from aioelastic.store.http._app import SESSIONS, make_app
    from aioelastic.store.http._session_raw import RawSession
    from aioelastic.store.memory import MemoryEngine

    hub = make_app(MemoryEngine() if engine is None else engine)[SESSIONS]
    sessions: dict[int, RawSession] = {}
    rounds = []
    for index, segment in enumerate(segments):
        start = time.thread_time()
        for item in segment:
            session = sessions.get(item[1])
            if session is None:
                session = sessions[item[1]] = RawSession(hub, lambda exc: None, _Drop())
                session.start()
            if item[0] == "D":
                session.data_received(item[2])
            else:
                session.connection_lost(None)
            await asyncio.sleep(0)  # a loop turn: the flush queue's callback
        if index % 2:
            rounds.append((time.thread_time() - start) / joins)
        elif index == 0:
            # The set-up's heap out of the collector's sight: a full collection of it falls in a
            # warm round or not by the count of allocations (a 3% step of the figure for a few
            # objects more or fewer); the collections of what the rounds allocate still count.
            gc.collect()
            gc.freeze()
    gc.unfreeze()
    return rounds


def _run_replay(path: Path, joins: int, upto: int | None) -> list[float]:
    segments = _segments(path)[:upto]
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_replay(segments, joins))
    return uvloop.run(_replay(segments, joins))


def _instructions(checkout: Path, path: Path, joins: int) -> float:
    """callgrind's instruction count per warm join of ``checkout``'s code."""
    segments = len(_segments(path))
    warm = (segments - 1) // 2
    counts = []
    for upto in (1, segments):  # (the same code path both times; no teardown counted)
        with tempfile.NamedTemporaryFile(suffix=".callgrind") as out:
            args = [sys.executable, __file__, "--replay", str(path), "--joins", str(joins)]
            args += ["--repeat", "1", "--upto", str(upto)]
            done = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", *args],
                env=dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED="0"),
                cwd=checkout,
                capture_output=True,
                text=True,
            )
        match = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode or match is None:
            raise RuntimeError(done.stderr[-800:])
        counts.append(int(match[1]))
    return (counts[1] - counts[0]) / (warm * joins)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, help="record a server's session reads to FILE")
    parser.add_argument("--replay", type=Path, help="replay FILE (see --instructions)")
    parser.add_argument("--n", type=int, default=64, help="node processes (--record)")
    parser.add_argument("--warm", type=int, default=3, help="warm rounds (--record)")
    parser.add_argument("--joins", type=int, default=64, help="joins per round of FILE")
    parser.add_argument("--repeat", type=int, default=5, help="replays (CPU time)")
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    parser.add_argument("--against", type=Path, help="another checkout, replayed the same way")
    parser.add_argument("--upto", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.record is not None:
        record(args.record, args.n, args.warm)
        return
    if args.replay is None:
        parser.error("--record FILE or --replay FILE")
    if args.upto is not None:  # (a callgrind run's replay)
        _run_replay(args.replay, args.joins, args.upto)
        sys.stdout.flush()
        os._exit(0)  # (the interpreter's teardown of a larger heap is no join's work)
    sides = [ROOT] + ([args.against.resolve()] if args.against else [])
    if args.instructions:
        got = {side: _instructions(side, args.replay, args.joins) for side in sides}
        for side, count in got.items():
            print(f"{side}: {count:,.0f} instructions per warm join")
        if args.against:
            print(f"this / {sides[1]}: {got[ROOT] / got[sides[1]]:.3f}")
        return
    if args.against:  # the CPU figure of another checkout: this file run with its code
        command = [sys.executable, __file__, "--replay", str(args.replay)]
        done = subprocess.run(
            [*command, "--joins", str(args.joins), "--repeat", str(args.repeat)],
            env=dict(os.environ, PYTHONPATH=str(sides[1])),
            cwd=sides[1],
            capture_output=True,
            text=True,
            check=True,
        )
        print(done.stdout.strip().replace(str(ROOT), str(sides[1])))
    rounds = [r for _ in range(args.repeat) for r in _run_replay(args.replay, args.joins, None)]
    print(
        f"{ROOT}: CPU per warm join {statistics.median(rounds) * 1e6:.1f} us "
        f"({min(rounds) * 1e6:.1f}-{max(rounds) * 1e6:.1f}, {len(rounds)} rounds)"
    )


if __name__ == "__main__":
    main()
