"""A session request's metering and its answers around the operation table
(``store/http/_session_conn.py``'s dispatch) over a recording sender, no socket: each operation
is observed once with its name, the HTTP status its answer stands for and its time, as the REST
routes are; a frame the table never sees is answered and not metered; a write that waits for
the data directory is answered after it, or with ``storage_error`` when it failed."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import pytest
from helpers.session_conn import Recorder, message_body, next_iteration

from aioelastic.store.http._frames import ERROR, REQUEST, RESULT, pack
from aioelastic.store.http._persist import LogWriteError
from aioelastic.store.http._session_conn import Connection
from aioelastic.store.http._session_server import SessionHub
from aioelastic.store.memory import MemoryEngine

Observed = list[tuple[str, int, float]]


def _connect(
    engine: MemoryEngine, *, durable: Any = None, max_watches: int = 10
) -> tuple[Connection, Recorder, Observed]:
    observed: Observed = []
    hub = SessionHub(
        engine,
        max_key_bytes=100,
        max_value_bytes=1000,
        max_watches=max_watches,
        durable=durable,
        observe=lambda *args: observed.append(args),
    )
    recorder = Recorder()
    connection = hub.greet(recorder, pack([REQUEST, 0, "hello", {"versions": [1]}]))
    assert connection is not None
    recorder.writes.clear()  # the welcome
    return connection, recorder, observed


def _ask(connection: Connection, recorder: Recorder, op: str, args: Any) -> list[Any]:
    """The answer to one request (asked as a lone frame, the usual case)."""
    recorder.writes.clear()
    connection.received_one(message_body([REQUEST, 7, op, args]))
    (answer,) = recorder.frames(0)
    return answer


@pytest.mark.asyncio
async def test_an_answered_operation_is_metered_once_with_its_name_200_and_its_time() -> None:
    connection, recorder, observed = _connect(MemoryEngine())
    assert _ask(connection, recorder, "put", ["k", b"v", 0])[0] == RESULT
    assert _ask(connection, recorder, "get", ["k"])[0] == RESULT
    assert [(op, status) for op, status, _ in observed] == [("put", 200), ("get", 200)]
    assert all(0 <= seconds < 1.0 for _, _, seconds in observed)


@pytest.mark.parametrize(
    ("op", "args", "code", "status"),
    [
        ("get", [1], "bad_request", 400),
        ("get", ["k" * 101], "key_too_large", 413),
        ("put", ["k", b"v" * 1001, 0], "value_too_large", 413),
        ("lease_keep_alive", [12345], "lease_not_found", 404),
        ("watch", ["", 1, False], "compacted", 410),
    ],
)
@pytest.mark.asyncio
async def test_a_refused_operation_is_metered_with_the_status_of_its_code(
    op: str, args: list[Any], code: str, status: int
) -> None:
    engine = MemoryEngine()
    for value in (b"1", b"2"):
        engine.put("k", value, 0)
    engine.compact(engine.revision)
    connection, recorder, observed = _connect(engine)
    answer = _ask(connection, recorder, op, args)
    assert answer[:3] == [ERROR, 7, code]
    ((name, metered, seconds),) = observed
    assert (name, metered) == (op, status)
    assert 0 <= seconds < 1.0


@pytest.mark.asyncio
async def test_too_many_watches_and_a_closed_store_are_metered_503() -> None:
    engine = MemoryEngine()
    connection, recorder, observed = _connect(engine, max_watches=0)
    assert _ask(connection, recorder, "watch", ["", None, False])[2] == "too_many_watches"
    engine.close()
    assert _ask(connection, recorder, "get", ["k"])[2] == "unavailable"
    assert [(op, status) for op, status, _ in observed] == [("watch", 503), ("get", 503)]


@pytest.mark.parametrize(
    ("error", "code", "status"),
    [
        (LogWriteError(errno.ENOSPC, "No space left on device"), "insufficient_storage", 507),
        (LogWriteError(errno.EIO, "Input/output error"), "storage_unavailable", 503),
        (RuntimeError("a bug"), "internal", 500),
    ],
)
@pytest.mark.asyncio
async def test_a_failing_engine_is_metered_with_the_status_of_its_failure(
    error: Exception, code: str, status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = MemoryEngine()
    connection, recorder, observed = _connect(engine)

    def put(*args: Any) -> Any:
        raise error

    monkeypatch.setattr(engine, "put", put)
    assert _ask(connection, recorder, "put", ["k", b"v", 0])[:3] == [ERROR, 7, code]
    assert [(op, metered) for op, metered, _ in observed] == [("put", status)]


@pytest.mark.parametrize(
    ("frame", "answer"),
    [
        ([REQUEST, 7, "nope", []], [ERROR, 7, "unknown_op", "no operation 'nope'", {}]),
        ([REQUEST, 7, 42, []], [ERROR, 7, "unknown_op", "no operation '42'", {}]),
        (
            [REQUEST, 7, "get", "k"],
            [ERROR, 7, "bad_request", "the arguments must be an array", {}],
        ),
    ],
)
@pytest.mark.asyncio
async def test_a_request_the_table_never_sees_is_answered_and_not_metered(
    frame: list[Any], answer: list[Any]
) -> None:
    connection, recorder, observed = _connect(MemoryEngine())
    connection.received_one(message_body(frame))
    assert recorder.frames(0) == [answer]
    assert observed == []
    assert recorder.closed is None  # (an answer, not the end of the connection)


@pytest.mark.asyncio
async def test_a_write_is_answered_once_durable_and_metered_at_once() -> None:
    engine = MemoryEngine()
    released = asyncio.Event()

    async def durable() -> None:
        await released.wait()

    connection, recorder, observed = _connect(engine, durable=durable)
    connection.received_one(message_body([REQUEST, 7, "put", ["k", b"v", 0]]))
    await next_iteration()
    assert recorder.writes == []  # applied, not yet durable: no answer
    assert [(op, status) for op, status, _ in observed] == [("put", 200)]
    assert _ask(connection, recorder, "get", ["k"])[0] == RESULT  # a read does not wait
    recorder.writes.clear()
    released.set()
    await next_iteration()
    await next_iteration()
    assert recorder.frames(0) == [[RESULT, 7, engine.revision]]
    assert connection._tasks == set()  # (the answered write's task is let go)


@pytest.mark.asyncio
async def test_a_write_whose_durability_failed_is_answered_storage_error() -> None:
    async def durable() -> None:
        raise OSError(errno.EIO, "Input/output error")

    connection, recorder, _ = _connect(MemoryEngine(), durable=durable)
    connection.received_one(message_body([REQUEST, 7, "put", ["k", b"v", 0]]))
    for _ in range(3):
        await next_iteration()
    assert recorder.frames(0) == [
        [
            ERROR,
            7,
            "storage_error",
            "the data directory failed: [Errno 5] Input/output error",
            {},
        ]
    ]
    assert recorder.closed is None
