"""The http mode of ``benchmarks/scale.py``: one ``aioelastic serve`` process, N handlers spread
over client processes, a shared wall-clock t0.

Each client process opens one store client per handler (what today's http client does: every
participant its own connections and watch streams), says READY, waits for t0 on its stdin,
then runs its handlers' ``next_rendezvous`` at t0 and prints the wall-clock time its last one
returned and the ranks it got (or the first error and how many failed). The runner checks that
every rank 0..N-1 came back exactly once, and reads the server's RSS and CPU time from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.rendezvous._state import RunKeys
from aioelastic.store import open_store
from benchmarks.scale import RoundFigures

ROOT = Path(__file__).resolve().parent.parent
#: how long a client waits for its round before it gives up (the join timeout)
JOIN_TIMEOUT = 60.0


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(ROOT) if not path else f"{ROOT}{os.pathsep}{path}")


@contextlib.contextmanager
def serve() -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``aioelastic serve`` on a free port: (process, URL, the lines it printed since)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aioelastic", "serve", "--port", "0"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"listening on (\S+)", first)
        if not match:
            raise RuntimeError(f"aioelastic serve did not start: {first!r}")
        # drain its output (a full pipe would stop the server), keeping it for the report
        drain = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
        drain.start()
        yield proc, match.group(1), lines
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _proc_cpu_rss(pid: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of a process, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(stat[11]) + int(stat[12])) / ticks
    rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


async def client(url: str, run_id: str, n: int, count: int) -> None:
    """One client process: ``count`` of the N handlers (see the module doc)."""
    stores = [await open_store(url) for _ in range(count)]
    handlers = [
        DynamicRendezvousHandler(
            store, run_id, n, n, local_addr="127.0.0.1", join_timeout=JOIN_TIMEOUT, owns_store=True
        )
        for store in stores
    ]
    print("READY", flush=True)
    t0 = float(await asyncio.to_thread(sys.stdin.readline))
    await asyncio.sleep(max(0.0, t0 - time.time()))
    last = 0.0

    async def join(h: DynamicRendezvousHandler) -> int:
        nonlocal last
        result = await h.next_rendezvous()
        last = max(last, time.time())
        return result.rank

    outcomes = await asyncio.gather(*(join(h) for h in handlers), return_exceptions=True)
    ranks = [r for r in outcomes if isinstance(r, int)]
    errors = [e for e in outcomes if isinstance(e, BaseException)]
    if errors:
        first = f"{type(errors[0]).__name__}: {errors[0]}".replace("\n", " ")[:300]
        print("FAILED", len(errors), first, flush=True)
    else:
        print("DONE", last, ",".join(map(str, ranks)), flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # released: every client has answered
    await asyncio.gather(*(h.aclose() for h in handlers), return_exceptions=True)


async def _record_sizes(url: str, run_id: str) -> tuple[int, int]:
    keys = RunKeys(run_id)
    async with await open_store(url) as store:
        record = await store.get(keys.round)
        state = await store.range(keys.root)
    return (0 if record is None else len(record.value)), sum(
        len(kv.key) + len(kv.value) for kv in state.kvs
    )


def _spawn(url: str, run_id: str, n: int, counts: list[int]) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale_http", url, run_id, str(n), str(count)],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for count in counts
    ]


def _answer(proc: subprocess.Popen[str]) -> list[str]:
    """A client's answer: ``DONE <time> <ranks>`` or ``FAILED <count> <error>``, split."""
    assert proc.stdout is not None
    return proc.stdout.readline().strip().split(" ", 2)


def _tell(procs: list[subprocess.Popen[str]], line: str) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(line)
        proc.stdin.flush()


def _check(answers: list[list[str]], n: int, server_lines: list[str]) -> None:
    """Every client answered DONE, and the ranks are 0..N-1 exactly once; else raise."""
    failed = [a for a in answers if a[0] != "DONE"]
    if failed:
        total = sum(int(a[1]) for a in failed if a[0] == "FAILED")
        first = " ".join(failed[0]).strip()
        said = f"; the server logged {len(server_lines)} lines" + (
            f", the last: {server_lines[-1].strip()[:200]}" if server_lines else ""
        )
        raise RuntimeError(f"{total} of {n} handlers failed; first: {first}{said}")
    ranks = sorted(int(r) for a in answers for r in a[2].split(","))
    if ranks != list(range(n)):
        raise AssertionError(f"ranks of the round of {n} are not 0..{n - 1} exactly once")


def run_http(n: int, clients: int) -> RoundFigures:
    """One round of N over one ``aioelastic serve``, the handlers spread over ``clients``."""
    run_id = f"scale-{uuid.uuid4().hex[:8]}"
    counts = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
    with serve() as (server, url, server_lines):
        procs = _spawn(url, run_id, n, [c for c in counts if c])
        try:
            for proc in procs:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if not line.startswith("READY"):
                    raise RuntimeError(f"a client process said {line!r}")
            cpu_before, _ = _proc_cpu_rss(server.pid)
            t0 = time.time() + 0.5
            _tell(procs, f"{t0}\n")
            answers = [_answer(proc) for proc in procs]
            cpu_after, rss = _proc_cpu_rss(server.pid)
            record_bytes, state_bytes = asyncio.run(_record_sizes(url, run_id))  # before leaving
            _tell(procs, "go\n")
            for proc in procs:
                proc.wait(timeout=120)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        _check(answers, n, server_lines)
    return RoundFigures(
        n=n,
        seconds=max(float(a[1]) for a in answers) - t0,
        cpu_seconds=cpu_after - cpu_before,  # the server's
        events=None,
        writes=None,
        watcher_visits=None,
        keys_scanned=None,
        record_bytes=record_bytes,
        state_bytes=state_bytes,
        server_rss_bytes=rss,
    )


if __name__ == "__main__":
    url_, run_id_, n_, count_ = sys.argv[1:5]
    asyncio.run(client(url_, run_id_, int(n_), int(count_)))
