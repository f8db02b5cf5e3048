"""A connection of ``aioelastic serve`` from its accept to its first bytes.

Every accepted connection starts as a :class:`NewConnection`: counted by the connection budget
(``max_connections``; a silent one may be closed to make room) and timed by the read deadline
(one that never sends a byte is answered 408 and closed). Its first read decides what it is: a
session's whole upgrade request becomes the session stream at once
(:class:`~._session_raw.DirectUpgrade`), without aiohttp's request machinery; anything else is
handed to aiohttp's connection handler (:mod:`._protocol`) with that read, as if aiohttp had
accepted it. Only asyncio's protocol interface is used to hand it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from ._connections import ConnectionBudget
from ._protocol import HandlerFactory, write_read_timeout
from ._session_raw import DirectUpgrade, RawSession

__all__ = ["Intake", "NewConnection"]


class Intake:
    """The listener's side of new connections: their budget, their read deadline, the direct
    upgrade, and aiohttp's handlers for the rest. It is the protocol factory given to
    ``loop.create_server``."""

    __slots__ = ("_upgrade", "budget", "handler", "live", "observe", "read_timeout")

    def __init__(
        self,
        handler: HandlerFactory,
        *,
        budget: ConnectionBudget | None,
        read_timeout: float | None,
        observe: Callable[[str, int, float], None],
        upgrade: DirectUpgrade | None,
    ) -> None:
        self.handler = handler
        self.budget = budget
        self.read_timeout = read_timeout
        self.observe = observe
        self._upgrade = upgrade
        #: connections not handed to aiohttp: not yet spoken, or sessions taken directly (aiohttp
        #: tracks the rest in ``web.Server.connections``)
        self.live: set[NewConnection] = set()

    def __call__(self) -> NewConnection:
        return NewConnection(self)

    def take_session(self, connection: NewConnection, data: bytes) -> RawSession | None:
        if self._upgrade is None or connection.over_limit:
            return None
        return self._upgrade.take(connection.transport, data, connection.session_lost)

    def close_silent(self) -> None:
        """The server stops: close every connection that has not spoken (a session taken
        directly is ended by its hub)."""
        for connection in list(self.live):
            if connection.silent:
                connection.close_silent()


class NewConnection(asyncio.Protocol):
    """One accepted connection until its first bytes (and, for a session taken directly, what
    the budget counts until its end)."""

    __slots__ = ("_intake", "_timer", "over_limit", "silent", "since", "started", "transport")

    def __init__(self, intake: Intake) -> None:
        self._intake = intake
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport
        #: accepted over max_connections: answered /healthz only (ConnectionBudget)
        self.over_limit = False
        self.silent = True
        self.since = 0.0  # the loop's time at the accept
        self.started = 0.0  # perf_counter at a direct session's upgrade (its metered duration)
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        intake = self._intake
        loop = asyncio.get_running_loop()
        self.since = now = loop.time()
        intake.live.add(self)
        if intake.budget is not None:
            intake.budget.opened(self, now)
        if intake.read_timeout is not None:
            self._timer = loop.call_at(now + intake.read_timeout, self._read_deadline)

    def data_received(self, data: bytes) -> None:
        if not self.silent:  # (a read that raced the hand-over: never, in asyncio or uvloop)
            return
        self.silent = False
        intake = self._intake
        if intake.budget is not None:
            intake.budget.spoke(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.started = time.perf_counter()
        if intake.take_session(self, data) is None:
            self._hand_over(data)

    def _hand_over(self, data: bytes) -> None:
        """To aiohttp's handler, with the bytes read so far: it tracks the connection now."""
        intake = self._intake
        intake.live.discard(self)
        handler = intake.handler(self, self.since, self.over_limit, intake.budget)
        transport = self.transport
        transport.set_protocol(handler)
        handler.connection_made(transport)
        handler.data_received(data)

    def eof_received(self) -> bool | None:
        return None  # the transport closes (aiohttp's handler would do the same)

    def connection_lost(self, exc: Exception | None) -> None:
        """Lost before it spoke (after, the transport tells its new protocol)."""
        self._end()

    def session_lost(self, exc: Exception | None) -> None:
        """The end of a session taken directly, told by its :class:`RawSession`."""
        self._intake.observe("session", 101, time.perf_counter() - self.started)
        self._end()

    def _end(self) -> None:
        intake = self._intake
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self in intake.live:
            intake.live.discard(self)
            if intake.budget is not None:
                intake.budget.closed(self)

    def close_silent(self) -> None:
        """Close this connection, which has not sent a byte (the budget needs its slot)."""
        with contextlib.suppress(Exception):
            self.transport.close()

    def _read_deadline(self) -> None:
        """No byte within the read timeout: 408, then the end."""
        self._timer = None
        timeout = self._intake.read_timeout
        if not self.silent or timeout is None or self.transport.is_closing():
            return
        waited = asyncio.get_running_loop().time() - self.since
        write_read_timeout(self.transport, timeout)
        self._intake.observe("other", 408, waited)
        self.transport.close()


def intake_for(
    handler: HandlerFactory,
    *,
    observe: Callable[[str, int, float], None],
    refused: Callable[[str], None],
    read_timeout: float | None,
    max_connections: int | None,
    upgrade: DirectUpgrade | None,
) -> Intake:
    """The protocol factory for ``loop.create_server``: new connections handed to ``handler``
    (:func:`~._protocol.handler_factory`) or taken as sessions by ``upgrade`` (None: every
    connection goes to aiohttp).

    ``observe(op, status, seconds)`` meters a 408 on a silent connection and a direct
    session's end; ``refused(reason)`` counts connections over ``max_connections`` (None: no
    budget).
    """
    budget = None
    if max_connections is not None:
        # A connection silent for half the read timeout (at most 1 s) may go to make room.
        grace = min(1.0, read_timeout / 2) if read_timeout is not None else 1.0
        budget = ConnectionBudget(max_connections, grace, refused)
    return Intake(
        handler, budget=budget, read_timeout=read_timeout, observe=observe, upgrade=upgrade
    )
