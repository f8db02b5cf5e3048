"""The http client's bounds, each at work: the dial slots of one event loop, the TCP connect's
own timeout, the requests in flight (``max_connections``, 0 for none) and their slots given
back, the connecting backoff's cap and its first warning, and the errors a refused write gets.
Fake servers on 127.0.0.1 (``helpers.fake_session``) decide what each request gets."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from helpers import free_port
from helpers.fake_session import Peer, fake_session_server
from helpers.waiting import eventually

from aioelastic.errors import StoreConnectionError, WriteOutcomeUnknownError
from aioelastic.store import open_store
from aioelastic.store.http import HttpStore, _session_client
from aioelastic.store.http._frames import ERROR, RESULT
from aioelastic.store.http._session_dial import DIALS_AT_ONCE, Backoff, Dialer, NotYet, _dial_slots

#: Generous upper bounds: the machine is shared.
SLACK = 3.0


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose connects hang: its listen backlog (0) is filled by one connection never
    accepted, so the kernel drops the next SYNs (the client sees neither refusal nor answer)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))
    try:
        yield port
    finally:
        filler.close()
        listener.close()


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on (connects are refused)."""
    return free_port()


@pytest.mark.asyncio
async def test_the_tcp_connect_gives_up_at_its_own_timeout(silent_port: int) -> None:
    """A connect the server never answers is given up after ``connect_timeout``, not after the
    whole budget: another attempt may then get through (a SYN lost to a full backlog)."""
    dialer = Dialer(f"http://127.0.0.1:{silent_port}", headers={}, ssl=None, connect_timeout=0.4)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(NotYet, match="timed out"):
        await dialer.dial({}, budget=10.0)
    elapsed = loop.time() - started
    assert elapsed >= 0.35
    assert elapsed < 0.4 + SLACK


@pytest.mark.asyncio
async def test_a_dial_waits_for_one_of_the_loop_s_slots_within_its_budget(
    closed_port: int,
) -> None:
    """With every dial slot of the loop taken, a dial waits its budget for one, then says so;
    a slot given back lets the next dial through at once."""
    slots = _dial_slots()
    for _ in range(DIALS_AT_ONCE):
        await slots.acquire()
    dialer = Dialer(f"http://127.0.0.1:{closed_port}", headers={}, ssl=None, connect_timeout=5)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        words = rf"no dial slot within 0\.3s \({DIALS_AT_ONCE} connections being opened"
        with pytest.raises(NotYet, match=words):
            await dialer.dial({}, budget=0.3)
        elapsed = loop.time() - started
        assert elapsed >= 0.25
        assert elapsed < 0.3 + SLACK
        slots.release()
        with pytest.raises(NotYet, match="Connect call failed"):  # a slot: it tried the port
            await dialer.dial({}, budget=5.0)
    finally:
        for _ in range(DIALS_AT_ONCE - 1):
            slots.release()


@pytest.mark.asyncio
async def test_a_request_waits_for_a_slot_only_as_long_as_its_timeout(closed_port: int) -> None:
    """``max_connections=1``: a call held up connecting (for its caller's longer deadline) keeps
    the one slot; another call waits ``timeout`` for it, then fails saying why, sent nowhere."""
    url = f"http://127.0.0.1:{closed_port}"
    async with open_store(url, max_connections=1, timeout=0.3) as store:

        async def held() -> None:
            with anyio.fail_after(20):  # a caller's deadline later than the request timeout
                await store.get("a")

        holder = asyncio.ensure_future(held())
        assert isinstance(store, HttpStore)
        limit = store.session._limit
        assert limit is not None
        await eventually(lambda: limit.free == 0, 10, "the holder's slot")
        loop = asyncio.get_running_loop()
        started = loop.time()
        words = r"get 'b': no request slot within 0\.3s \(max_connections requests in flight\)"
        with pytest.raises(StoreConnectionError, match=words):
            await store.get("b")
        elapsed = loop.time() - started
        assert elapsed >= 0.25
        assert elapsed < 0.3 + SLACK
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder


def _answer_when(count: int, answered: list[int]) -> Any:
    """A fake's answer function: holds every ``revision`` request until ``count`` of them are in
    flight at once, then answers them all (and those after at once)."""
    held: list[tuple[Peer, int]] = []

    async def answer(peer: Peer, frame: list[Any]) -> None:
        held.append((peer, frame[1]))
        if len(held) >= count:
            for holder, rid in held:
                holder.send([RESULT, rid, 7])
            answered.append(len(held))
            held.clear()

    return answer


@pytest.mark.asyncio
async def test_max_connections_0_puts_no_limit_on_requests_in_flight() -> None:
    """150 requests in flight at once (more than the default limit of 100): all are sent before
    any is answered."""
    answered: list[int] = []
    async with (
        fake_session_server(_answer_when(150, answered)) as (url, _),
        open_store(url, max_connections=0, timeout=10) as store,
    ):
        values = await asyncio.gather(*(store.current_revision() for _ in range(150)))
    assert values == [7] * 150
    assert answered == [150]


@pytest.mark.asyncio
async def test_every_slot_given_back_is_taken_again() -> None:
    """``max_connections=3``: three requests in flight, answered together, give back three slots:
    the next three are in flight at once too (the fake answers only three at a time)."""
    answered: list[int] = []
    async with (
        fake_session_server(_answer_when(3, answered)) as (url, _),
        open_store(url, max_connections=3, timeout=10) as store,
    ):
        for _ in range(3):
            assert await asyncio.gather(*(store.current_revision() for _ in range(3))) == [7] * 3
    assert answered == [3, 3, 3]


@pytest.mark.asyncio
async def test_a_storage_error_is_an_unknown_outcome_for_a_write_only() -> None:
    """The server's ``storage_error`` (its disk refused the write after the engine applied it):
    a write's outcome is unknown; a read is a plain connection error."""

    async def storage_error(peer: Peer, frame: list[Any]) -> None:
        peer.send([ERROR, frame[1], "storage_error", "no space left on device", {}])

    async with fake_session_server(storage_error) as (url, _), open_store(url) as store:
        with pytest.raises(WriteOutcomeUnknownError, match="put 'k': no space left"):
            await store.put("k", b"v")
        with pytest.raises(StoreConnectionError, match="storage_error") as read:
            await store.get("k")
        assert not isinstance(read.value, WriteOutcomeUnknownError)


@pytest.mark.parametrize(("budget", "cap"), [(30.0, 2.0), (1.0, 0.25), (0.1, 0.05)])
@pytest.mark.asyncio
async def test_the_connecting_backoff_s_cap_is_a_quarter_of_the_budget_within_bounds(
    monkeypatch: pytest.MonkeyPatch, closed_port: int, budget: float, cap: float
) -> None:
    """A quarter of the budget, at least 50 ms and at most 2 s: several attempts fit in a short
    budget, and a long one never waits more than 2 s between two."""
    caps: list[float] = []

    class Recorded(Backoff):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            caps.append(self.cap)

    monkeypatch.setattr(_session_client, "Backoff", Recorded)
    async with open_store(f"http://127.0.0.1:{closed_port}", timeout=budget) as store:
        with anyio.move_on_after(0.2), pytest.raises(StoreConnectionError):
            await store.get("k")
    assert caps == [cap]


@pytest.mark.asyncio
async def test_the_store_not_answering_is_said_at_the_first_failed_attempt(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, closed_port: int
) -> None:
    """The warning comes with the first attempt refused, before any backoff wait (then once a
    while per URL, not once per attempt)."""
    monkeypatch.setattr(_session_client, "_said_not_answering", {})
    attempts: list[int] = []
    dial = Dialer.dial

    async def counted(self: Dialer, hello: dict[str, Any], budget: float) -> Any:
        attempts.append(1)
        return await dial(self, hello, budget)

    monkeypatch.setattr(Dialer, "dial", counted)
    said_at: list[int] = []

    class Counting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "does not answer" in record.getMessage():
                said_at.append(len(attempts))

    handler = Counting()
    logging.getLogger("aioelastic.store.http").addHandler(handler)
    try:
        async with open_store(f"http://127.0.0.1:{closed_port}", timeout=1.0) as store:
            with pytest.raises(StoreConnectionError, match="attempts within 1s"):
                await store.get("k")
    finally:
        logging.getLogger("aioelastic.store.http").removeHandler(handler)
    assert said_at == [1]
    assert len(attempts) > 1
