"""The HTTP store server's connection budget: how many connections it holds, which one goes when
a flood fills them, the open-file limit and listen backlog it starts with, and a log that a flood
cannot fill (at most one line a second)."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "FD_RESERVE",
    "OVERFLOW",
    "ConnectionBudget",
    "LogLimiter",
    "connection_room",
    "listen_backlog",
    "raise_open_file_limit",
]

#: Descriptors kept for everything but client connections: listening sockets, the event loop,
#: the data directory's files, logs and the odd file a request opens.
FD_RESERVE = 64
#: Descriptors kept for connections accepted beyond ``max_connections`` only to answer them
#: (``/healthz`` as usual, anything else ``503 too_many_connections``).
OVERFLOW = 64
#: The listen backlog wanted: thousands of clients connecting at once (the kernel caps it at
#: ``net.core.somaxconn``).
WANTED_BACKLOG = 65535


class _Connection(Protocol):
    #: Set on a connection accepted over ``max_connections``: answer /healthz, refuse the rest.
    over_limit: bool

    def close_silent(self) -> None:
        """Close this connection, which has not sent a byte (the budget needs its slot)."""


class ConnectionBudget:
    """Counts open connections (O(1) per event) and decides what a new one gets.

    A connection that has not sent a byte yet is *silent*; silent connections are kept in
    arrival order. When a new connection finds all ``max_connections`` slots taken, the oldest
    silent one is closed to make room if it has been silent for ``grace`` seconds (a flood of
    idle sockets is what fills a server; a client sends its request as soon as it connects).
    Otherwise the new one is *over the limit*: its request is read (within the read timeout, as
    any) and answered, ``/healthz`` as usual and anything else ``503 too_many_connections``,
    then it is closed. A client is never cut off without an answer.
    """

    def __init__(
        self, max_connections: int, grace: float, on_refused: Callable[[str], None]
    ) -> None:
        self.max_connections = max_connections
        self._grace = grace
        self._on_refused = on_refused
        self.open = 0
        #: Silent connections and when each arrived, oldest first.
        self._silent: dict[_Connection, float] = {}
        #: Closed to make room, already uncounted (their connection_lost comes later).
        self._closing: set[_Connection] = set()

    def opened(self, connection: _Connection, now: float) -> None:
        """Account for a new connection (``now``: the loop's time)."""
        self.open += 1
        if self.open > self.max_connections:
            oldest = next(iter(self._silent), None)
            if oldest is not None and now - self._silent[oldest] >= self._grace:
                del self._silent[oldest]
                self._closing.add(oldest)
                self.open -= 1
                self._on_refused("silent_closed")
                oldest.close_silent()
            else:
                connection.over_limit = True
                self._on_refused("over_limit")
        self._silent[connection] = now

    def spoke(self, connection: _Connection) -> None:
        """The connection sent its first bytes: it is no longer silent."""
        self._silent.pop(connection, None)

    def closed(self, connection: _Connection) -> None:
        if connection in self._closing:
            self._closing.discard(connection)
            return
        self.open -= 1
        self._silent.pop(connection, None)


def connection_room() -> int:
    """The client connections the open-file limit has room for: the soft limit (a large number
    where there is none) less :data:`FD_RESERVE` and :data:`OVERFLOW`, at least 1."""
    limit = 1 << 20
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        pass
    else:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = limit if soft == resource.RLIM_INFINITY else soft
    return max(1, limit - FD_RESERVE - OVERFLOW)


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft limit of open files to the hard one; (before, after). (-1, -1) where
    the platform has no such limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # pragma: no cover - refused by the platform
            return soft, soft
        return soft, hard
    return soft, soft


def listen_backlog(wanted: int = WANTED_BACKLOG) -> tuple[int, int | None]:
    """(the backlog to ask for, ``net.core.somaxconn`` or None where unknown): ``wanted``,
    capped by somaxconn, since the kernel caps it there silently anyway."""
    try:
        with open("/proc/sys/net/core/somaxconn") as file:
            somaxconn = int(file.read().strip())
    except (OSError, ValueError):
        return wanted, None
    return max(1, min(wanted, somaxconn)), somaxconn


class LogLimiter(logging.Filter):
    """At most one log line a second (WARNING and above) from the loggers it filters; the next
    line let through says how many were suppressed. Lines about running out of file descriptors
    (``EMFILE``, ``ENFILE``) are counted too (:attr:`fd_exhausted`), suppressed or not.

    Attached to ``aiohttp.server`` and ``aioelastic.serve`` by the server, and to ``asyncio``
    (accept errors) by ``aioelastic serve``, so that a flood of failing connections writes a
    line a second, not one per connection."""

    def __init__(
        self,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        #: Called with "suppressed" or "fd_exhausted" (the server's metrics count them).
        self.on_event = on_event
        self._last = -float("inf")
        self.pending = 0
        self.suppressed = 0
        self.fd_exhausted = 0
        self._loggers: list[logging.Logger] = []

    def attach(self, *names: str) -> None:
        for name in names:
            logger = logging.getLogger(name)
            logger.addFilter(self)
            self._loggers.append(logger)

    def detach(self, *names: str) -> None:
        """Stop filtering the loggers named (a flood after a server stopped, e.g. asyncio's
        accept retries, is still limited by the loggers left attached)."""
        for name in names:
            logger = logging.getLogger(name)
            if logger in self._loggers:
                logger.removeFilter(self)
                self._loggers.remove(logger)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            self.fd_exhausted += 1
            if self.on_event is not None:
                self.on_event("fd_exhausted")
        if record.levelno < logging.WARNING:
            return True
        now = self._clock()
        if now - self._last < self._interval:
            self.pending += 1
            self.suppressed += 1
            if self.on_event is not None:
                self.on_event("suppressed")
            return False
        self._last = now
        if self.pending:
            record.msg = f"{record.getMessage()} ({self.pending} similar lines suppressed)"
            record.args = None
            self.pending = 0
        return True
