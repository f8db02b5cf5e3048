"""The server's connection limits, in process (``store/http/_connections.py``): the soft limit of
open files raised to the hard one, the client connections it has room for, the listen backlog
capped by ``net.core.somaxconn``, the log limiter on the loggers it is attached to, and the
budget forgetting what it closed. ``tests/test_http_connections.py`` runs a real ``serve`` under
a lowered limit; these pin each figure, with the ``resource`` module and ``/proc`` stood in."""

from __future__ import annotations

import builtins
import errno
import io
import logging
import resource
import sys
from typing import Any

import pytest

from aioelastic.store.http._connections import (
    FD_RESERVE,
    OVERFLOW,
    WANTED_BACKLOG,
    ConnectionBudget,
    LogLimiter,
    connection_room,
    listen_backlog,
    raise_open_file_limit,
)


class FakeLimits:
    """``getrlimit``/``setrlimit`` of RLIMIT_NOFILE over a (soft, hard) pair."""

    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.limits = (soft, hard)
        self.refuse = refuse
        self.set: list[tuple[int, int]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def getrlimit(which: int) -> tuple[int, int]:
            assert which == resource.RLIMIT_NOFILE
            return self.limits

        def setrlimit(which: int, limits: tuple[int, int]) -> None:
            assert which == resource.RLIMIT_NOFILE
            if self.refuse:
                raise ValueError("not allowed")
            self.set.append(limits)
            self.limits = limits

        monkeypatch.setattr(resource, "getrlimit", getrlimit)
        monkeypatch.setattr(resource, "setrlimit", setrlimit)


def test_the_soft_limit_is_raised_to_the_hard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeLimits(1024, 4096)
    fake.install(monkeypatch)
    assert raise_open_file_limit() == (1024, 4096)
    assert fake.set == [(4096, 4096)]
    assert raise_open_file_limit() == (4096, 4096)  # at the hard limit already: nothing set
    assert fake.set == [(4096, 4096)]


def test_an_unlimited_hard_limit_or_a_refusal_leaves_the_soft_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unlimited = FakeLimits(1024, resource.RLIM_INFINITY)
    unlimited.install(monkeypatch)
    assert raise_open_file_limit() == (1024, 1024)
    assert unlimited.set == []
    refused = FakeLimits(256, 512, refuse=True)
    refused.install(monkeypatch)
    assert raise_open_file_limit() == (256, 256)


@pytest.mark.parametrize(
    ("soft", "room"),
    [
        (10_000, 10_000 - FD_RESERVE - OVERFLOW),
        (FD_RESERVE + OVERFLOW + 1, 1),
        (FD_RESERVE + OVERFLOW, 1),  # at least one
        (5, 1),
        (resource.RLIM_INFINITY, (1 << 20) - FD_RESERVE - OVERFLOW),
    ],
)
def test_the_room_for_connections_is_the_soft_limit_less_the_reserve(
    monkeypatch: pytest.MonkeyPatch, soft: int, room: int
) -> None:
    FakeLimits(soft, resource.RLIM_INFINITY).install(monkeypatch)
    assert connection_room() == room


def _somaxconn(monkeypatch: pytest.MonkeyPatch, text: str | None) -> None:
    real_open = builtins.open

    def fake_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if path == "/proc/sys/net/core/somaxconn":
            if text is None:
                raise FileNotFoundError(path)
            return io.StringIO(text)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)


@pytest.mark.parametrize(
    ("somaxconn", "wanted", "backlog"),
    [("4096\n", 100, (100, 4096)), ("4096", 10_000, (4096, 4096)), ("0", 10, (1, 0))],
)
def test_the_backlog_is_the_wanted_one_capped_by_somaxconn(
    monkeypatch: pytest.MonkeyPatch, somaxconn: str, wanted: int, backlog: tuple[int, int]
) -> None:
    _somaxconn(monkeypatch, somaxconn)
    assert listen_backlog(wanted) == backlog


@pytest.mark.parametrize("somaxconn", [None, "many\n"])
def test_without_a_readable_somaxconn_the_backlog_is_the_wanted_one(
    monkeypatch: pytest.MonkeyPatch, somaxconn: str | None
) -> None:
    _somaxconn(monkeypatch, somaxconn)
    assert listen_backlog() == (WANTED_BACKLOG, None)
    assert listen_backlog(77) == (77, None)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_an_attached_limiter_limits_its_loggers_until_detached() -> None:
    clock = Clock()
    limiter = LogLimiter(interval=1.0, clock=clock)
    lines = Lines()
    names = ("aioelastic.test.limited.a", "aioelastic.test.limited.b")
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(lines)
        logger.propagate = False
    try:
        limiter.attach(*names)
        assert all(limiter in logger.filters for logger in loggers)
        loggers[0].warning("first %s", "line")  # the first line, as it was
        loggers[1].warning("second")
        loggers[0].error("third")
        clock.now += 0.999
        loggers[1].warning("fourth")
        clock.now += 0.001  # a whole interval since the first line
        loggers[0].warning("fifth %d", 5)
        assert lines.lines == ["first line", "fifth 5 (3 similar lines suppressed)"]
        loggers[1].warning("sixth")  # suppressed: counted again from zero
        clock.now += 1.0
        loggers[1].warning("seventh")
        assert lines.lines[2:] == ["seventh (1 similar lines suppressed)"]
        limiter.detach(names[0])
        assert limiter not in loggers[0].filters
        assert limiter in loggers[1].filters
        loggers[0].warning("free")
        loggers[0].warning("and free")
        assert lines.lines[3:] == ["free", "and free"]
        limiter.detach(*names)
        limiter.detach(names[0])  # (not attached: nothing to do)
        assert limiter not in loggers[1].filters
    finally:
        for logger in loggers:
            logger.removeHandler(lines)
            logger.removeFilter(limiter)
            logger.propagate = True


def test_warnings_are_limited_and_lines_below_them_never() -> None:
    clock = Clock()
    limiter = LogLimiter(clock=clock)

    def record(level: int, exc: BaseException | None = None) -> logging.LogRecord:
        exc_info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("x", level, __file__, 1, "m", None, exc_info)

    assert limiter.filter(record(logging.WARNING))
    assert not limiter.filter(record(logging.WARNING))
    assert limiter.filter(record(logging.INFO))
    assert (limiter.pending, limiter.suppressed) == (1, 1)
    enfile = OSError(errno.ENFILE, "Too many open files in system")
    other = OSError(errno.ECONNRESET, "reset")
    limiter.filter(record(logging.INFO, enfile))
    limiter.filter(record(logging.ERROR, other))
    assert limiter.fd_exhausted == 1  # ENFILE counted, whatever its level; other errors not


def test_the_budget_forgets_a_connection_it_closed_once_that_one_is_lost() -> None:
    class Conn:
        over_limit = False

        def close_silent(self) -> None:
            pass

    budget = ConnectionBudget(1, 0.0, lambda why: None)
    old, new = Conn(), Conn()
    budget.opened(old, 0.0)
    budget.opened(new, 1.0)  # old, silent, makes room
    assert budget._closing == {old}
    budget.closed(old)
    assert budget._closing == set()
    assert budget.open == 1


def test_without_the_resource_module_nothing_is_raised_and_the_room_is_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "resource", None)  # as on Windows: the import fails
    assert raise_open_file_limit() == (-1, -1)
    assert connection_room() == (1 << 20) - FD_RESERVE - OVERFLOW
