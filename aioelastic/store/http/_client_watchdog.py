"""The silence watchdog of a session's connection: a connection with watches hears from the
server at least every progress interval (a progress frame on each idle watch). After three
intervals without a message while it has watches, the watchdog asks the server (a request the
server answers at once) and ends the connection only if nothing at all arrives within one more
interval: a server that answers is alive, however late its progress frames (a loaded host), and
a client loop that was itself held up reads what waited meanwhile. One timer per connection, not
a receive timeout per message."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["Watchdog"]


class _Watched(Protocol):
    loop: asyncio.AbstractEventLoop
    lost: bool
    watches: dict[int, object]
    last_received: float
    #: the last check that found no watches, or the first watch's request (silence counts
    #: from then on)
    unwatched_at: float

    def abort(self, reason: str) -> None: ...


class Watchdog:
    """Watches ``conn`` for ``silence`` seconds (3 progress intervals) without a message;
    ``probe()`` sends the question on it. ``cancel()`` stops it (the connection ended)."""

    __slots__ = ("_conn", "_probe", "_timer", "interval", "probed_at", "silence")

    def __init__(self, conn: _Watched, silence: float, probe: Callable[[], None]) -> None:
        self._conn = conn
        self._probe = probe
        self.silence = silence
        self.interval = silence / 3
        #: when the probe unanswered so far was sent
        self.probed_at: float | None = None
        self._timer = conn.loop.call_later(silence, self.check)

    def cancel(self) -> None:
        self._timer.cancel()

    def check(self) -> None:
        conn = self._conn
        if conn.lost:
            return
        now = conn.loop.time()
        if not conn.watches:
            conn.unwatched_at = now  # silence counts only while there are watches
            self.probed_at = None
        since = max(conn.last_received, conn.unwatched_at)
        probed_at = self.probed_at
        if probed_at is not None and conn.last_received >= probed_at:
            self.probed_at = probed_at = None  # heard from since the probe
        if probed_at is not None:
            if now - probed_at >= self.interval:
                conn.abort(
                    f"nothing received for {self.silence:g}s (3 progress intervals), "
                    f"nor an answer to a probe within {self.interval:g}s"
                )
                return
            due = probed_at + self.interval
        elif conn.watches and now - since >= self.silence:
            self.probed_at = now
            self._probe()
            due = now + self.interval
        else:
            due = since + self.silence
        self._timer = conn.loop.call_later(max(due - now, 0.01), self.check)
