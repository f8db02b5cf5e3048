"""``aioelastic serve`` that also prints the moments of a session's end, for the timeline of
``benchmarks/scale_http.py --kill``: ``python -m benchmarks._timeline_serve serve --port 0 ...``.

Each moment is a line ``TIMELINE <what> <wall-clock time> [figures]`` on its standard output
(which the benchmark reads): ``detached`` when the connection of a session that holds leases
ends (the server saw the socket close); ``revoking`` when its grace has passed and its leases
are revoked, and ``revoked`` after that, with the connections then queued for writing (the
watchers woken); ``written`` when the write callback after it has written them, with the
server thread's CPU seconds it took. A session without leases (the benchmark's own short
calls) prints nothing. Instrument only: the server does what ``aioelastic serve`` does.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from aioelastic.store.http._session_flush import FlushQueue
from aioelastic.store.http._session_server import SessionHub, SessionState

__all__ = ["install"]


def _say(what: str, *figures: object) -> None:
    print("TIMELINE", what, f"{time.time():.6f}", *figures, flush=True)


def install() -> None:
    """Wrap the session hub's end of a session and the flush queue's write callback."""
    detach, end, run = SessionHub.detach, SessionHub._end, FlushQueue._run
    after_revoke = [False]

    def detach_said(hub: SessionHub, connection: Any) -> None:
        if connection.state.connection is connection and connection.state.leases:
            _say("detached", len(connection.state.leases))
        detach(hub, connection)

    def end_said(hub: SessionHub, state: SessionState) -> None:
        leases = len(state.leases) if state.connection is None else 0
        if leases:
            _say("revoking", leases)
        end(hub, state)
        if leases:
            _say("revoked", len(hub.flushes))
            after_revoke[0] = True

    def run_said(queue: FlushQueue) -> None:
        if not after_revoke[0]:
            run(queue)
            return
        after_revoke[0] = False
        count, cpu = len(queue), time.thread_time()
        run(queue)
        _say("written", count, f"{time.thread_time() - cpu:.6f}")

    setattr(SessionHub, "detach", detach_said)  # noqa: B010 - the instrument, on purpose
    setattr(SessionHub, "_end", end_said)  # noqa: B010
    setattr(FlushQueue, "_run", run_said)  # noqa: B010


if __name__ == "__main__":
    install()
    from aioelastic.cli import main

    raise SystemExit(main(sys.argv[1:]))
