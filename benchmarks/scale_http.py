"""The http mode of ``benchmarks/scale.py``: one ``aioelastic serve`` process, N handlers spread
over client processes, a shared wall-clock t0.

Each client process opens one store (one session) per handler, says READY, waits for t0 on its
stdin, then runs its handlers' ``next_rendezvous`` at t0 and prints (one JSON line) the
wall-clock time its last one returned, the ranks it got (or the first error and how many
failed), its CPU time, and the events and event bytes its sessions received. The runner checks
that every rank 0..N-1 came back exactly once, and reads the server's RSS and CPU time from
/proc and its revision before and after (the store writes of the round).

Each client process runs its handlers on uvloop's event loop when uvloop is installed (as
``aioelastic serve --loop auto`` and the torchrun adapter's loop thread do; it roughly halves
the client's CPU per request), asyncio's otherwise; ``client_loop`` ("asyncio", "uvloop") picks
one (``--client-loop``).

The client processes run at a lower priority than the server (``nice`` +3: the server weighs
twice as much as one of them with the scheduler): on a cluster the coordination server has a
host (a core) of its own while every participant runs elsewhere; here they share the machine's
cores, and without it the server would wait behind eight busy clients.

``kill=True`` (``--kill``): one of the N handlers runs in a process of its own, which is
SIGKILLed once the round has formed; every other handler waits for ``PARTICIPANT_LOST``
(``wait_for_change``, the session's leases revoked after the server's session grace) and then
joins the next round, of N - 1. Figures: the SIGKILL to the last survivor that saw the loss,
and from then to the last return of the new round (handlers have min = N - 1, max = N and a
``last_call_timeout`` of :data:`KILL_LAST_CALL`; the new round never reaches max, but forms as
soon as every survivor has registered again, without waiting out its last call:
``fast_reform``, the handlers' default).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio

from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousEventKind
from aioelastic.rendezvous._state import RunKeys
from aioelastic.store import Store, open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._client_conn import Connection
from aioelastic.store.http._frames import EVENTS, EVENTS_MANY
from benchmarks.scale import RoundFigures

ROOT = Path(__file__).resolve().parent.parent
#: how long a client waits for its round before it gives up (the join timeout; ``--join-timeout``)
JOIN_TIMEOUT = 60.0
#: the handlers' lease TTL (torch's 15 s; ``--lease-ttl``): on a machine whose cores 8 clients of
#: 1,250 participants share with other work, a starved client's keep-alives can miss it
LEASE_TTL = 15.0
#: the client processes' niceness above the server's (see the module doc)
CLIENT_NICE = 3
#: ``--kill``: the handlers' last-call window (the first round's, min N - 1; the round of N - 1
#: forms without waiting it out once every survivor registered again: ``fast_reform``)
KILL_LAST_CALL = 1.0
#: The sessions' progress interval (s): the server sends each idle watch a progress frame this
#: often, and a client counts a session silent for three as lost. The default (2 s) costs the
#: server 5,000 frames a second at 10,000 idle watches, and on a machine whose cores are shared
#: by 8 busy clients a client can stall 6 s; a job of that size sets it higher.
PROGRESS_INTERVAL = 10.0


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(ROOT) if not path else f"{ROOT}{os.pathsep}{path}")


@contextlib.contextmanager
def serve(
    n: int, *, timeline: bool = False
) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``aioelastic serve`` on a free port for a round of ``n``: (process, URL, the lines it
    printed since). Its history holds 4 N events (the N registrations of a round at once, and
    room to spare) so that no watcher falls behind a compaction and reads everything again.
    ``timeline``: run it as :mod:`benchmarks._timeline_serve` (it prints when a session ends)."""
    history = str(max(10_000, 4 * n))
    command = [sys.executable, "-m", "benchmarks._timeline_serve"] if timeline else None
    with serve_process(["--history-limit", history], _env(), command=command) as started:
        yield started


@contextlib.contextmanager
def serve_process(
    args: list[str],
    env: dict[str, str],
    cwd: Path | None = None,
    *,
    command: list[str] | None = None,
) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``aioelastic serve --port 0 ARGS`` (in ``cwd``, with ``env``) until the block ends:
    (process, URL, the lines it printed since), its output drained (a full pipe would stop the
    server) and kept for the report; SIGTERM at the end. ``command``: what runs the
    ``aioelastic`` command (``python -m aioelastic`` if not given)."""
    proc = subprocess.Popen(
        [*(command or [sys.executable, "-m", "aioelastic"]), "serve", "--port", "0", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    drain: threading.Thread | None = None
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"listening on (\S+)", first)
        if not match:
            raise RuntimeError(f"aioelastic serve did not start: {first!r}")
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
        if drain is not None:
            drain.join(timeout=5)  # (at the end of the output: the process has exited)
        if proc.stdout is not None and (drain is None or not drain.is_alive()):
            proc.stdout.close()


def _proc_cpu_rss(pid: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of a process, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(stat[11]) + int(stat[12])) / ticks
    rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


class _Received:
    """Events and event bytes the sessions of this process received (a counting wrapper around
    the connections' frame dispatch: the benchmark's instrument, not the library's)."""

    def __init__(self) -> None:
        self.events = 0
        self.bytes = 0
        self._installed = False

    def count(self, store: Store) -> None:
        if not isinstance(store, HttpStore) or self._installed:  # (another backend: not counted)
            return
        self._installed = True  # every connection of the process, once
        dispatch: Callable[[Connection, list[Any]], None] = Connection._dispatch

        def counting(conn: Connection, frame: list[Any]) -> None:
            dispatch(conn, frame)
            if frame[0] == EVENTS:
                self.events += len(conn.decoded.events)
                self.bytes += len(frame[2])
            elif frame[0] == EVENTS_MANY:  # (protocol version 2: the events of several watches)
                self.events += len(conn.decoded.events) * len(frame[1])
                self.bytes += len(frame[2])

        setattr(Connection, "_dispatch", counting)  # noqa: B010 - the instrument, on purpose


def _say(kind: str, **fields: Any) -> None:
    print(kind, json.dumps(fields), flush=True)


async def _joined(
    handlers: list[DynamicRendezvousHandler], join_timeout: float = JOIN_TIMEOUT
) -> tuple[float, list[int], str, int]:
    """Every handler's ``next_rendezvous``: (last return, ranks, first error, errors)."""
    last = 0.0

    async def join(h: DynamicRendezvousHandler) -> int:
        nonlocal last
        # the caller's deadline: the store keeps trying to connect until then
        with anyio.fail_after(join_timeout):
            result = await h.next_rendezvous()
        last = max(last, time.time())
        return result.rank

    outcomes = await asyncio.gather(*(join(h) for h in handlers), return_exceptions=True)
    ranks = [r for r in outcomes if isinstance(r, int)]
    errors = [e for e in outcomes if isinstance(e, BaseException)]
    first = "" if not errors else f"{type(errors[0]).__name__}: {errors[0]}"[:300]
    return last, ranks, first, len(errors)


async def _lost_then_again(handlers: list[DynamicRendezvousHandler], join_timeout: float) -> None:
    """``--kill``, a survivor process: when every handler saw the loss, then the next round."""
    seen, earliest = 0.0, float("inf")

    async def watch(h: DynamicRendezvousHandler) -> str:
        nonlocal seen, earliest
        event = await h.wait_for_change()
        now = time.time()
        seen, earliest = max(seen, now), min(earliest, now)
        return event.kind.name

    kinds = await asyncio.gather(*(watch(h) for h in handlers), return_exceptions=True)
    wrong = [k for k in kinds if k != RendezvousEventKind.PARTICIPANT_LOST.name]
    wrongs = [str(k)[:200] for k in wrong[:3]]
    _say("LOST", at=seen, first=earliest, wrong=wrongs, wrong_count=len(wrong))
    last, ranks, first, failed = await _joined(handlers, join_timeout)
    _say("AGAIN", at=last, ranks=ranks, error=first, failed=failed)


async def client(
    url: str,
    run_id: str,
    n: int,
    count: int,
    role: str,
    join_timeout: float = JOIN_TIMEOUT,
    lease_ttl: float = LEASE_TTL,
) -> None:
    """One client process: ``count`` of the N handlers (see the module doc); ``role``: "all"
    (one round), "survivor" or "victim" (``--kill``)."""
    os.nice(CLIENT_NICE)
    kill = role != "all"
    options = {"progress_interval": PROGRESS_INTERVAL} if url.startswith("http") else {}
    stores = [await open_store(url, **options) for _ in range(count)]
    received = _Received()
    for store in stores:
        received.count(store)
    handlers = [
        DynamicRendezvousHandler(
            store,
            run_id,
            n - 1 if kill else n,
            n,
            local_addr="127.0.0.1",
            join_timeout=join_timeout,
            lease_ttl=lease_ttl,
            last_call_timeout=KILL_LAST_CALL if kill else 30.0,
            participants=False,  # a member reads its own record, not all N ids
            owns_store=True,
        )
        for store in stores
    ]
    print("READY", flush=True)
    t0 = float(await asyncio.to_thread(sys.stdin.readline))
    await asyncio.sleep(max(0.0, t0 - time.time()))
    cpu = time.process_time()
    last, ranks, first, failed = await _joined(handlers, join_timeout)
    cpu = time.process_time() - cpu
    retries = sum(s.session.connect_retries for s in stores if isinstance(s, HttpStore))
    _say(
        "DONE",
        at=last,
        ranks=ranks,
        error=first,
        failed=failed,
        cpu=cpu,
        events=received.events,
        bytes=received.bytes,
        connect_retries=retries,
    )
    if role == "survivor" and not failed:
        await _lost_then_again(handlers, join_timeout)
    await asyncio.to_thread(sys.stdin.readline)  # released: every client has answered
    await asyncio.gather(*(h.aclose() for h in handlers), return_exceptions=True)


async def _record_sizes(url: str, run_id: str) -> tuple[int, int, int]:
    """(round record bytes, bytes of the run's keys and values, the store's revision)."""
    keys = RunKeys(run_id)
    async with await open_store(url) as store:
        record = await store.get(keys.round)
        state = await store.range(keys.root)
    return (
        (0 if record is None else len(record.value)),
        sum(len(kv.key) + len(kv.value) for kv in state.kvs),
        state.revision,
    )


async def _revision(url: str) -> int:
    async with await open_store(url) as store:
        return await store.current_revision()


def client_loop_name(choice: str) -> str:
    """The event loop a client process runs for ``--client-loop`` ``choice`` ("auto": uvloop
    when it is installed)."""
    if choice != "auto":
        return choice
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def run_client(loop: str, main: Coroutine[Any, Any, None]) -> None:
    """``main`` on the event loop named ``loop`` ("asyncio" or "uvloop")."""
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def _spawn(url: str, run_id: str, n: int, counts: list[int], *args: str) -> list[Client]:
    return [Client(url, run_id, n, count, *args) for count in counts if count]


class Client:
    """A client process and the answers it gave (the JSON after ``DONE`` and so on)."""

    def __init__(self, url: str, run_id: str, n: int, count: int, *more: str) -> None:
        args = [url, run_id, str(n), str(count), *more]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale_http", *args],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def answer(self, kind: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        said, _, rest = line.strip().partition(" ")
        if said != kind:
            raise RuntimeError(f"a client process said {line.strip()[:300]!r}, not {kind}")
        answer: dict[str, Any] = json.loads(rest) if rest else {}
        return answer

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # (stdin: a broken pipe's last flush)
                    pipe.close()


def _check(answers: list[dict[str, Any]], n: int, server_lines: list[str], what: str) -> None:
    """Every client answered without an error, and the ranks are 0..N-1 exactly once."""
    failed = [a for a in answers if a["failed"]]
    if failed:
        total = sum(a["failed"] for a in failed)
        said = f"; the server logged {len(server_lines)} lines" + (
            f", the last: {server_lines[-1].strip()[:200]}" if server_lines else ""
        )
        raise RuntimeError(
            f"{what}: {total} of {n} handlers failed; first: {failed[0]['error']}{said}"
        )
    ranks = sorted(r for a in answers for r in a["ranks"])
    if ranks != list(range(n)):
        raise AssertionError(
            f"{what}: the ranks of the round of {n} are not 0..{n - 1} exactly once"
        )


def run_http(
    n: int,
    clients: int,
    *,
    kill: bool = False,
    join_timeout: float = JOIN_TIMEOUT,
    lease_ttl: float = LEASE_TTL,
    client_loop: str = "auto",
) -> RoundFigures:
    """One round of N over one ``aioelastic serve``, the handlers spread over ``clients``
    processes (``kill``: plus one process with one handler, SIGKILLed after the round) that run
    on ``client_loop`` (:func:`client_loop_name`)."""
    run_id = f"scale-{uuid.uuid4().hex[:8]}"
    spread = n - 1 if kill else n
    counts = [spread // clients + (1 if i < spread % clients else 0) for i in range(clients)]
    with serve(n, timeline=kill) as (server, url, server_lines):
        timing = (str(join_timeout), str(lease_ttl), client_loop_name(client_loop))
        procs = _spawn(url, run_id, n, counts, "survivor" if kill else "all", *timing)
        victim = Client(url, run_id, n, 1, "victim", *timing) if kill else None
        everyone = procs + ([victim] if victim is not None else [])
        try:
            for proc in everyone:
                proc.answer("READY")
            revision = asyncio.run(_revision(url))
            cpu_before, _ = _proc_cpu_rss(server.pid)
            t0 = time.time() + 0.5
            for proc in everyone:
                proc.tell(f"{t0}\n")
            answers = [proc.answer("DONE") for proc in everyone]
            cpu_after, rss = _proc_cpu_rss(server.pid)
            record_bytes, state_bytes, revision_after = asyncio.run(_record_sizes(url, run_id))
            _check(answers, n, server_lines, "the round")
            lost = _kill_and_rejoin(victim, procs, n, server_lines) if victim else None
            timeline = None if lost is None else lost[2]
            for proc in everyone:
                if proc is not victim:
                    proc.tell("go\n")
            for proc in procs:
                proc.proc.wait(timeout=120)
        finally:
            for proc in everyone:
                proc.stop()
    return RoundFigures(
        n=n,
        seconds=max(float(a["at"]) for a in answers) - t0,
        cpu_seconds=cpu_after - cpu_before,  # the server's
        events=sum(a["events"] for a in answers),
        writes=revision_after - revision,
        watcher_visits=None,
        keys_scanned=None,
        record_bytes=record_bytes,
        state_bytes=state_bytes,
        server_rss_bytes=rss,
        event_bytes=sum(a["bytes"] for a in answers),
        client_cpu_seconds=sum(a["cpu"] for a in answers),
        connect_retries=sum(a["connect_retries"] for a in answers),
        lost_seen_seconds=None if lost is None else lost[0],
        new_round_seconds=None if lost is None else lost[1],
        kill_timeline=timeline,
    )


def _kill_and_rejoin(
    victim: Client, survivors: list[Client], n: int, server_lines: list[str]
) -> tuple[float, float, dict[str, float]]:
    """SIGKILL the victim; (seconds until every survivor saw it lost, then until the round of
    N - 1 returned everywhere, the timeline of the loss: :func:`kill_timeline`)."""
    time.sleep(0.2)  # the survivors are in wait_for_change
    killed = time.time()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    lost = [proc.answer("LOST") for proc in survivors]
    wrong = [a for a in lost if a["wrong_count"]]
    if wrong:
        raise RuntimeError(f"a survivor saw {wrong[0]['wrong']}, not PARTICIPANT_LOST")
    seen = max(float(a["at"]) for a in lost)
    again = [proc.answer("AGAIN") for proc in survivors]
    _check(again, n - 1, server_lines, "the round after the kill")
    first = min(float(a["first"]) for a in lost)
    timeline = kill_timeline(server_lines, killed, first, seen)
    return seen - killed, max(float(a["at"]) for a in again) - seen, timeline


def kill_timeline(
    server_lines: list[str], killed: float, first: float, seen: float
) -> dict[str, float]:
    """Seconds after the SIGKILL of each moment of the loss: the server saw the connection end
    (``detached``), its grace ended and it revoked the leases (``revoking``, ``revoked``), wrote
    the woken connections (``written``; ``written_cpu``: its CPU seconds, ``written_count``: how
    many), the first and the last survivor returned PARTICIPANT_LOST (``first_seen``,
    ``last_seen``). The server's moments are the first of each after the kill (its
    ``TIMELINE`` lines, :mod:`benchmarks._timeline_serve`); one it did not print is missing."""
    timeline = {"first_seen": first - killed, "last_seen": seen - killed}
    for line in list(server_lines):
        said = line.split()
        if len(said) < 3 or said[0] != "TIMELINE" or float(said[2]) < killed:
            continue
        what, at = said[1], float(said[2])
        if what in timeline:
            continue
        timeline[what] = at - killed
        if what == "written" and len(said) >= 5:
            timeline["written_count"] = float(said[3])
            timeline["written_cpu"] = float(said[4])
    return timeline


if __name__ == "__main__":
    url_, run_id_, n_, count_, *more = sys.argv[1:]
    role_ = more[0] if more else "all"
    join_ = float(more[1]) if len(more) > 1 else JOIN_TIMEOUT
    ttl_ = float(more[2]) if len(more) > 2 else LEASE_TTL
    loop_ = more[3] if len(more) > 3 else "asyncio"
    run_client(loop_, client(url_, run_id_, int(n_), int(count_), role_, join_, ttl_))
