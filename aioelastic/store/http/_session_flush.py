"""The writes of a server's session connections: one loop callback for all that woke at once.

A put seen by watches on N connections (a round record reaching N rendezvous members) wakes N
connections. Each used to schedule a callback of its own (an asyncio handle each, N dispatches
by the loop); they queue here instead, and one callback writes every queued connection in the
order they woke. A connection that wakes while that callback runs is written by the next.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._session_conn import Connection

__all__ = ["FlushQueue"]

log = logging.getLogger("aioelastic.serve")


class FlushQueue:
    """Connections with something to write (:meth:`add`), written by one callback soon."""

    __slots__ = ("_handle", "_queued")

    def __init__(self) -> None:
        self._queued: list[Connection] = []
        self._handle: asyncio.Handle | None = None

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, connection: Connection) -> None:
        """Write ``connection`` soon (once per :meth:`add`: the connection asks once)."""
        self._queued.append(connection)
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        self._handle = None
        queued, self._queued = self._queued, []
        for connection in queued:
            try:
                connection._flush()  # (the connection's own writer: it queued itself)
            except Exception:  # one connection's failure is not the others'
                log.exception("writing a session connection failed")
