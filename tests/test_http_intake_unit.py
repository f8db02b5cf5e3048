"""A new connection's life in the intake (``store/http/_intake.py``) over a recording transport
(no socket): what the connection budget is told at each step, the hand-over to aiohttp's handler
with the first read, the read deadline, and the metering of a direct session's end. The same
paths on real sockets are ``tests/test_http_session_intake.py`` and
``tests/test_http_connection_limits.py``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from helpers.transport import Transport

from aioelastic.store.http._intake import Intake, NewConnection, intake_for


class Handler:
    """What aiohttp's handler factory returns, recorded: how it was made and what it was told."""

    def __init__(self, *args: Any) -> None:
        self.args = args
        self.events: list[tuple[str, Any]] = []

    def connection_made(self, transport: Any) -> None:
        self.events.append(("made", transport))

    def data_received(self, data: bytes) -> None:
        self.events.append(("data", data))


def _intake(
    *, max_connections: int | None = None, read_timeout: float | None = None
) -> tuple[Intake, list[Handler], list[str], list[tuple[str, int, float]]]:
    handlers: list[Handler] = []
    refused: list[str] = []
    observed: list[tuple[str, int, float]] = []

    def factory(*args: Any) -> Any:
        handlers.append(Handler(*args))
        return handlers[-1]

    intake = intake_for(
        factory,
        observe=lambda *args: observed.append(args),
        refused=refused.append,
        read_timeout=read_timeout,
        max_connections=max_connections,
        upgrade=None,
    )
    return intake, handlers, refused, observed


def _accept(intake: Intake) -> tuple[NewConnection, Transport]:
    connection, transport = intake(), Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


@pytest.mark.asyncio
async def test_a_connection_that_speaks_is_handed_to_aiohttp_with_its_first_read() -> None:
    intake, handlers, _, _ = _intake(max_connections=4)
    connection, transport = _accept(intake)
    assert connection.silent
    assert not connection.over_limit
    assert intake.live == {connection}
    assert intake.budget is not None
    assert intake.budget.open == 1
    connection.data_received(b"GET /healthz HTTP/1.1\r\n\r\n")
    (handler,) = handlers
    assert handler.args == (connection, connection.since, False, intake.budget)
    assert transport.protocol is handler
    assert handler.events == [("made", transport), ("data", b"GET /healthz HTTP/1.1\r\n\r\n")]
    assert not connection.silent
    assert intake.live == set()  # aiohttp tracks it now
    assert intake.budget.open == 1  # (counted until aiohttp's handler loses it)
    connection.data_received(b"more")  # a read that raced the hand-over: ignored
    assert len(handlers) == 1
    assert len(handler.events) == 2


@pytest.mark.asyncio
async def test_a_connection_accepted_over_the_limit_is_handed_over_as_such() -> None:
    intake, handlers, refused, _ = _intake(max_connections=1, read_timeout=10.0)
    first, _ = _accept(intake)
    first.data_received(b"GET / HTTP/1.1\r\n\r\n")
    second, _ = _accept(intake)
    assert second.over_limit
    assert refused == ["over_limit"]
    second.data_received(b"GET /healthz HTTP/1.1\r\n\r\n")
    assert handlers[1].args[2] is True


@pytest.mark.asyncio
async def test_a_connection_that_spoke_is_never_closed_to_make_room() -> None:
    intake, _, refused, _ = _intake(max_connections=1, read_timeout=0.02)
    first, first_transport = _accept(intake)
    first.data_received(b"GET / HTTP/1.1\r\n\r\n")
    await asyncio.sleep(0.05)  # past the grace of a silent connection
    second, _ = _accept(intake)
    assert not first_transport.closed
    assert second.over_limit
    assert refused == ["over_limit"]


@pytest.mark.asyncio
async def test_a_connection_lost_before_it_spoke_frees_its_slot_and_its_deadline() -> None:
    intake, _, refused, observed = _intake(max_connections=1, read_timeout=0.4)
    first, first_transport = _accept(intake)
    first.connection_lost(None)
    assert intake.live == set()
    assert intake.budget is not None
    assert intake.budget.open == 0
    await asyncio.sleep(0.45)
    assert first_transport.data == b""
    assert observed == []
    # the slot is free: the next one is in, and the one after it finds that one (not the lost
    # one) the oldest silent connection, to close for room
    second, second_transport = _accept(intake)
    assert not second.over_limit
    assert refused == []
    await asyncio.sleep(0.25)  # past the grace (half the read timeout), before the deadline
    third, _ = _accept(intake)
    assert refused == ["silent_closed"]
    assert second_transport.closed
    assert not third.over_limit


@pytest.mark.parametrize(("read_timeout", "grace"), [(0.5, 0.25), (4.0, 1.0), (None, 1.0)], ids=str)
@pytest.mark.asyncio
async def test_a_silent_connection_goes_for_room_after_half_the_read_timeout_at_most_1s(
    read_timeout: float | None, grace: float
) -> None:
    intake, _, refused, _ = _intake(max_connections=1, read_timeout=read_timeout)
    budget = intake.budget
    assert budget is not None
    silent = Transport()
    oldest = intake()
    oldest.transport = silent
    budget.opened(oldest, 100.0)
    budget.opened(intake(), 100.0 + grace - 0.01)  # within the grace: over the limit
    assert refused == ["over_limit"]
    assert not silent.closed
    budget.opened(intake(), 100.0 + grace)  # the grace over: the silent one goes
    assert refused == ["over_limit", "silent_closed"]
    assert silent.closed


@pytest.mark.asyncio
async def test_without_max_connections_there_is_no_budget() -> None:
    intake, handlers, refused, _ = _intake()
    assert intake.budget is None
    connection, _ = _accept(intake)
    connection.data_received(b"GET / HTTP/1.1\r\n\r\n")
    assert handlers[0].args[3] is None
    connection.connection_lost(None)
    assert refused == []


@pytest.mark.asyncio
async def test_without_a_read_timeout_a_silent_connection_is_never_answered() -> None:
    intake, _, _, observed = _intake(max_connections=2)
    connection, transport = _accept(intake)
    await asyncio.sleep(0.05)
    assert transport.data == b""
    assert observed == []
    assert not transport.closed
    connection.data_received(b"GET / HTTP/1.1\r\n\r\n")  # (no deadline to cancel)
    connection.connection_lost(None)


@pytest.mark.asyncio
async def test_a_silent_connection_gets_the_408_at_its_deadline_metered_with_its_wait() -> None:
    intake, _, _, observed = _intake(read_timeout=0.03)
    connection, transport = _accept(intake)
    await asyncio.sleep(0.1)
    assert transport.data.startswith(b"HTTP/1.1 408 ")
    assert transport.closed
    ((op, status, waited),) = observed
    assert (op, status) == ("other", 408)
    assert 0.03 <= waited < 5.0
    connection.connection_lost(None)
    assert intake.live == set()


@pytest.mark.asyncio
async def test_a_deadline_after_the_first_read_answers_nothing() -> None:
    intake, _, _, observed = _intake(read_timeout=0.03)
    connection, transport = _accept(intake)
    connection.data_received(b"GET / HTTP/1.1\r\n")
    await asyncio.sleep(0.08)
    assert transport.data == b""
    assert observed == []


@pytest.mark.asyncio
async def test_a_direct_sessions_end_is_metered_from_its_upgrade_and_frees_its_slot() -> None:
    intake, _, _, observed = _intake(max_connections=2, read_timeout=0.05)
    connection, _ = _accept(intake)
    connection.silent = False  # (what data_received did before the direct upgrade took it)
    connection.started = time.perf_counter() - 0.5
    connection.session_lost(None)
    ((op, status, seconds),) = observed
    assert (op, status) == ("session", 101)
    assert 0.5 <= seconds < 5.0
    assert intake.live == set()
    assert intake.budget is not None
    assert intake.budget.open == 0


@pytest.mark.asyncio
async def test_close_silent_closes_only_the_connections_that_have_not_spoken() -> None:
    intake, _, _, _ = _intake(max_connections=4)
    _quiet, quiet_transport = _accept(intake)
    spoke, spoke_transport = _accept(intake)
    spoke.silent = False  # (a direct session: still live, no longer silent)
    intake.close_silent()
    assert quiet_transport.closed
    assert not spoke_transport.closed

    class Broken(Transport):
        def close(self) -> None:
            raise OSError("already gone")

    broken = intake()
    broken.connection_made(Broken())  # type: ignore[arg-type]
    broken.close_silent()  # (an error closing is nobody's to hear)
