"""The client's reading of the answer to its session hello, against a fake server on 127.0.0.1
that answers each hello as the test says: the welcome's fields and their defaults, a refusal
that may pass (tried again) or not (said at once), an answer that is not one, and none at all."""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest
from helpers.fake_session import WELCOME, Peer, fake_session_server

from aioelastic.errors import StoreConnectionError
from aioelastic.store import open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._frames import ERROR, RESULT


async def _answer_gets(peer: Peer, frame: list[Any]) -> None:
    if frame[2] == "get":
        peer.send([RESULT, frame[1], None])


async def _hang_up_on_gets(peer: Peer, frame: list[Any]) -> str:
    return "hang up"


@pytest.mark.asyncio
async def test_the_welcome_gives_the_session_its_version_grace_resume_leases_and_bound() -> None:
    told = {
        "version": 1,
        "resume": "tok",
        "grace": 0.5,
        "max_message": 65536,
        "leases": [3, "x", 5],
    }
    async with (
        fake_session_server(_answer_gets, welcome=lambda _: [RESULT, 0, told]) as (url, _),
        open_store(url) as store,
    ):
        assert isinstance(store, HttpStore)
        assert await store.get("k") is None
        session = store.session
        assert (session.version, session.grace, session._resume) == (1, 0.5, "tok")
        assert session.leases == {3, 5}  # what is not a lease id is left out
        assert session._conn is not None
        assert session._conn.max_message == 65536
        assert (session.connects, session.resumes) == (1, 0)


@pytest.mark.asyncio
async def test_a_welcome_that_says_nothing_leaves_the_defaults() -> None:
    async with (
        fake_session_server(_answer_gets, welcome=lambda _: [RESULT, 0, {}]) as (url, _),
        open_store(url) as store,
    ):
        assert isinstance(store, HttpStore)
        store.session.leases = {7}
        assert await store.get("k") is None
        session = store.session
        assert (session.version, session.grace, session._resume) == (0, 0.0, None)
        assert session.leases == {7}  # no list: what the session owns is not said
        assert session._conn is not None
        assert session._conn.max_message == 4 << 20


@pytest.mark.asyncio
async def test_each_connection_and_each_resume_is_counted() -> None:
    def welcome(n: int) -> list[Any]:
        return [RESULT, 0, {**WELCOME, "resumed": n > 1}]

    async with (
        fake_session_server(_hang_up_on_gets, welcome=welcome) as (url, seen),
        open_store(url, read_retries=2) as store,
    ):
        assert isinstance(store, HttpStore)
        with pytest.raises(StoreConnectionError):
            await store.get("k")  # sent three times, on three connections
        assert seen.connections == 3
        assert (store.session.connects, store.session.resumes) == (3, 2)


@pytest.mark.asyncio
async def test_a_refused_hello_is_said_at_once_with_the_servers_words() -> None:
    refusal = [ERROR, 0, "bad_version", "no common version", None]
    async with (
        fake_session_server(_answer_gets, welcome=lambda _: refusal) as (url, seen),
        open_store(url, timeout=10, read_retries=0) as store,
    ):
        with pytest.raises(StoreConnectionError) as info:
            await store.get("k")
    assert str(info.value) == f"{url} refused the session: no common version (bad_version)"
    assert seen.connections == 1  # it will not change: not tried again


@pytest.mark.asyncio
async def test_a_hello_timed_out_by_a_busy_server_is_tried_again() -> None:
    def welcome(n: int) -> list[Any]:
        busy = [ERROR, 0, "hello_timeout", "no hello within 5s", None]
        return busy if n == 1 else [RESULT, 0, WELCOME]

    async with (
        fake_session_server(_answer_gets, welcome=welcome) as (url, seen),
        open_store(url, timeout=10, read_retries=0) as store,
    ):
        assert await store.get("k") is None
        assert seen.connections == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"\xc1",  # not msgpack
        [RESULT, 0, "not a dict"],
        [RESULT, 0],
        [RESULT, 0, {}, "more"],
        [ERROR, 0, "code", "message"],  # an error frame has five fields
        [9, 0, {}],  # not an answer
        [RESULT, 0, {"pad": "x" * ((1 << 20) + 1)}],  # a string over the 1 MiB a welcome may hold
    ],
)
@pytest.mark.asyncio
async def test_an_answer_to_the_hello_that_is_not_one_is_said_at_once(answer: Any) -> None:
    async with (
        fake_session_server(_answer_gets, welcome=lambda _: answer) as (url, seen),
        open_store(url, timeout=10, read_retries=0) as store,
    ):
        with pytest.raises(StoreConnectionError) as info:
            await store.get("k")
    assert str(info.value) == f"{url}: a malformed answer to the hello"
    assert seen.connections == 1


@pytest.mark.asyncio
async def test_the_largest_welcome_is_read() -> None:
    body = msgpack.packb([RESULT, 0, {**WELCOME, "pad": "x" * (1 << 20)}])
    async with (
        fake_session_server(_answer_gets, welcome=lambda _: body) as (url, _),
        open_store(url, timeout=10) as store,
    ):
        assert await store.get("k") is None


@pytest.mark.asyncio
async def test_a_server_that_hangs_up_on_the_hello_is_tried_again_and_said_to_the_user(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        fake_session_server(_answer_gets, welcome=lambda n: "close" if n < 3 else None) as (
            url,
            seen,
        ),
        open_store(url, timeout=10, read_retries=0) as store,
    ):
        with caplog.at_level(logging.WARNING, logger="aioelastic.store.http"):
            assert await store.get("k") is None
    assert seen.connections == 3
    said = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith(
        f"the store at {url} does not answer "
        f"({url}: no answer to the session hello (the server closed it));"
    )


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"HTTP/1.1 404 Not Found\r\n\r\nno such", "no session endpoint"),  # body to the FIN
        (b"HTTP/1.1 404 Not", "the connection ended inside the answer's head"),
        (b"", "the connection ended before an answer"),
    ],
)
@pytest.mark.asyncio
async def test_an_upgrade_answer_ended_by_the_servers_fin_is_read_to_its_end(
    caplog: pytest.LogCaptureFixture, answer: bytes, said: str
) -> None:
    async with (
        fake_session_server(_answer_gets, refuse=lambda _: answer) as (url, _),
        open_store(url, timeout=0.5, read_retries=0) as store,
    ):
        with (
            caplog.at_level(logging.WARNING, logger="aioelastic.store.http"),
            pytest.raises(StoreConnectionError) as info,
        ):
            await store.get("k")
    if said == "no session endpoint":  # a refusal that will not change: at once
        assert str(info.value) == (
            f"{url} has no session endpoint (/v1/session): an older server? (HTTP 404: no such)"
        )
    else:  # tried again until the deadline; said to the user at the first
        warned = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
        assert warned[0].startswith(
            f"the store at {url} does not answer (cannot connect to {url}: {said});"
        )
