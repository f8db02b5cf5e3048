"""The session's operation table (``store/http/_session_ops.py``), one frame at a time over a
recording sender (no socket): every operation names itself and the argument it refuses, bounds
are the documented ones, and a refused request changes nothing."""

from __future__ import annotations

import errno
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from helpers.session_conn import connect, make_hub, message_body

from aioelastic.errors import CompactedError, LeaseNotFoundError, StoreClosedError
from aioelastic.store.http._frames import ERROR, REQUEST, RESULT
from aioelastic.store.http._persist import LogWriteError
from aioelastic.store.http._session_conn import Connection, error_frame
from aioelastic.store.http._session_ops import OPS, OpError, bad
from aioelastic.store.memory import MemoryEngine

#: Each operation's number of arguments (the wire's arrays; ``txn`` has its own checks).
ARITY = {
    "get": 1,
    "range": 2,
    "revision": 0,
    "put": 3,
    "delete": 2,
    "cas": 4,
    "cad": 2,
    "add": 2,
    "compact": 1,
    "lease_grant": 1,
    "lease_keep_alive": 1,
    "lease_revoke": 1,
    "lease_ttl": 1,
    "watch": 3,
    "unwatch": 1,
}


def _ask(connection: Connection, op: str, args: list[Any]) -> list[Any]:
    """The answer frame to one request of ``op`` with ``args``."""
    recorder = connection.sender
    before = len(recorder.writes)  # type: ignore[attr-defined]
    connection.received([message_body([REQUEST, 7, op, args])])
    [frame] = recorder.frames(before)  # type: ignore[attr-defined]
    assert frame[1] == 7
    return list(frame)


@pytest_asyncio.fixture
async def session() -> AsyncIterator[tuple[MemoryEngine, Connection]]:
    engine = MemoryEngine()
    connection, _ = connect(make_hub(engine))
    yield engine, connection
    connection.end()


def test_the_table_is_the_operations_the_arity_table_lists() -> None:
    assert set(OPS) == {*ARITY, "txn"}


@pytest.mark.asyncio
@pytest.mark.parametrize("op", sorted(ARITY))
async def test_a_wrong_number_of_arguments_names_the_operation(op: str, session: Any) -> None:
    engine, connection = session
    args = ["k"] * (ARITY[op] + 1)
    frame = _ask(connection, op, args)
    assert frame[:3] == [ERROR, 7, "bad_request"]
    assert frame[3] == f"{op} takes {ARITY[op]} argument(s), got {ARITY[op] + 1}"
    assert engine.revision == 0  # nothing written


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("op", "args", "message"),
    [
        ("cad", ["k", 0], "expected_mod_revision must be an integer in [1, 2**63), got 0"),
        ("cad", ["k", "1"], "expected_mod_revision must be an integer >= 1, got str"),
        ("cas", ["k", -1, b"v", 0], "expected_mod_revision must be an integer in [0, 2**63)"),
        ("compact", [0], "revision must be an integer in [1, 2**63), got 0"),
        ("compact", [True], "revision must be an integer >= 1, got bool"),
        ("put", ["k", b"v", -1], "lease must be an integer in [0, 2**63), got -1"),
        ("cas", ["k", 0, b"v", -1], "lease must be an integer in [0, 2**63), got -1"),
        ("lease_ttl", [0], "lease must be an integer in [1, 2**63), got 0"),
        ("lease_revoke", [0], "lease must be an integer in [1, 2**63), got 0"),
        ("range", ["p", 0], "limit must be an integer in [1, 2**63), got 0"),
        ("unwatch", [0], "watch id must be an integer in [1, 2**63), got 0"),
        ("watch", ["p", 0, False], "start_revision must be an integer in [1, 2**63), got 0"),
        ("lease_grant", [0], "ttl must be a finite number of seconds in (0, 1e9], got 0"),
    ],
)
async def test_a_refused_argument_is_named_with_its_bounds(
    op: str, args: list[Any], message: str, session: Any
) -> None:
    engine, connection = session
    frame = _ask(connection, op, args)
    assert frame[:3] == [ERROR, 7, "bad_request"]
    assert frame[3].startswith(message), frame[3]
    assert engine.revision == 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("op", "args", "code", "message"),
    [
        ("get", ["k" * 101], "key_too_large", "keys are at most 100 bytes (UTF-8)"),
        # 26 characters of 4 bytes: 104 bytes (more than a quarter of the limit in characters)
        ("get", ["\U0001d11e" * 26], "key_too_large", "keys are at most 100 bytes (UTF-8)"),
        ("get", [""], "bad_request", "the key must not be empty"),
        ("get", [b"k"], "bad_request", "a key must be a string, got bytes"),
        ("put", ["k", "v", 0], "bad_request", "a value must be bytes (msgpack bin), got str"),
        ("put", ["k", b"v" * 100_001, 0], "value_too_large", "values are at most 100000 bytes"),
        ("put", ["k", b"v", 2**63], "bad_request", "lease must be an integer in [0, 2**63)"),
        ("lease_grant", [1e9 + 1], "bad_request", "ttl must be a finite number of seconds"),
        ("lease_grant", [float("nan")], "bad_request", "ttl must be a finite number of seconds"),
        ("lease_grant", [-0.5], "bad_request", "ttl must be a finite number of seconds"),
        ("lease_grant", ["1"], "bad_request", "ttl must be a number of seconds, got str"),
        ("lease_grant", [False], "bad_request", "ttl must be a number of seconds, got bool"),
        ("lease_keep_alive", [0], "bad_request", "lease must be an integer in [1, 2**63), got 0"),
        (
            "watch",
            ["p", 1, True],
            "bad_request",
            "a snapshot reads the prefix now: it takes no start_revision",
        ),
    ],
)
async def test_an_argument_past_its_bound_is_refused_and_the_bound_itself_is_not(
    op: str, args: list[Any], code: str, message: str, session: Any
) -> None:
    engine, connection = session
    frame = _ask(connection, op, args)
    assert frame[:3] == [ERROR, 7, code]
    assert frame[3].startswith(message), frame[3]
    assert engine.revision == 0


@pytest.mark.asyncio
async def test_the_largest_key_value_lease_id_and_ttl_are_taken(session: Any) -> None:
    engine, connection = session
    for key in ("k" * 100, "\U0001d11e" * 25, "\u00e9" * 50):
        frame = _ask(connection, "put", [key, b"v" * 100_000, 0])
        assert frame[0] == RESULT, frame
        assert engine.get(key) is not None
    assert _ask(connection, "lease_grant", [1e9])[0] == RESULT
    assert _ask(connection, "lease_grant", [1])[0] == RESULT  # an int is seconds too
    frame = _ask(connection, "lease_keep_alive", [2**63 - 1])
    assert frame[2] == "lease_not_found"  # (past the argument check: no such lease)


@pytest.mark.asyncio
async def test_a_cas_puts_its_value_with_its_lease(session: Any) -> None:
    engine, connection = session
    lease = engine.lease_grant(30.0).id
    frame = _ask(connection, "cas", ["k", 0, b"v", lease])
    assert frame[:2] == [RESULT, 7]
    assert frame[2][0] is True
    kv = engine.get("k")
    assert kv is not None
    assert (kv.value, kv.lease) == (b"v", lease)


@pytest.mark.asyncio
async def test_compact_takes_revision_one(session: Any) -> None:
    engine, connection = session
    engine.put("k", b"v")
    assert _ask(connection, "compact", [1]) == [RESULT, 7, 1]


@pytest.mark.asyncio
@pytest.mark.parametrize("delta", [True, False, "1", 1.0, None, 2**63, -(2**63)])
async def test_an_add_takes_an_integer_of_at_most_64_bits(delta: Any, session: Any) -> None:
    engine, connection = session
    frame = _ask(connection, "add", ["n", delta])
    assert frame[:4] == [ERROR, 7, "bad_request", "delta must be an integer of at most 64 bits"]
    assert engine.get("n") is None


@pytest.mark.asyncio
@pytest.mark.parametrize("delta", [2**63 - 1, -(2**63) + 1])
async def test_an_add_of_the_largest_deltas_is_applied(delta: int, session: Any) -> None:
    engine, connection = session
    frame = _ask(connection, "add", ["n", delta])
    assert frame[:2] == [RESULT, 7]
    assert frame[2] == delta  # the new value: 0 + delta
    kv = engine.get("n")
    assert kv is not None
    assert int(kv.value) == delta


@pytest.mark.asyncio
async def test_a_prefix_delete_may_name_the_empty_prefix_a_key_delete_may_not(
    session: Any,
) -> None:
    engine, connection = session
    engine.put("a", b"1")
    engine.put("b/c", b"2")
    frame = _ask(connection, "delete", ["", False])
    assert frame[:4] == [ERROR, 7, "bad_request", "the key must not be empty"]
    frame = _ask(connection, "delete", ["", True])
    assert frame[:2] == [RESULT, 7]
    assert len(engine) == 0  # everything: the empty prefix is every key


@pytest.mark.asyncio
async def test_a_txn_over_the_size_limit_says_the_limit_and_its_size(session: Any) -> None:
    engine, connection = session
    values = [["put", f"k{i}", b"x" * 60_000, 0] for i in range(40)]  # 2.4 MB in all
    frame = _ask(connection, "txn", [[], values, []])
    assert frame[:3] == [ERROR, 7, "txn_too_large"]
    extra = frame[4]
    assert extra["limit"] == "bytes"
    assert extra["size"] > extra["maximum"]
    assert frame[3].startswith("transaction too large: "), frame[3]
    assert f"has {extra['size']} bytes, the limit is {extra['maximum']}" in frame[3]
    assert engine.revision == 0


def test_an_op_error_says_its_message_and_a_bad_request_is_cut_to_500_characters() -> None:
    error = OpError("key_too_large", "keys are at most 8 bytes", limit=8)
    assert str(error) == "keys are at most 8 bytes"
    assert (error.code, error.message, error.extra) == (
        "key_too_large",
        "keys are at most 8 bytes",
        {"limit": 8},
    )
    long = bad("x" * 600)
    assert long.code == "bad_request"
    assert long.message == "x" * 500


# -- the errors an operation raises, as answer frames ----------------------------------------------


@pytest.mark.parametrize(
    ("exc", "code", "message", "extra"),
    [
        (
            CompactedError(3, 9),
            "compacted",
            str(CompactedError(3, 9)),
            {"requested_revision": 3, "compact_revision": 9},
        ),
        (LeaseNotFoundError(0x2A), "lease_not_found", str(LeaseNotFoundError(0x2A)), {"lease": 42}),
        (StoreClosedError("the store is closed"), "unavailable", "the store is closed", {}),
        (
            LogWriteError(errno.ENOSPC, "No space left on device"),
            "insufficient_storage",
            "No space left on device; the write was not applied",
            {},
        ),
        (
            LogWriteError(errno.EIO, "Input/output error"),
            "storage_unavailable",
            "Input/output error; the write was not applied",
            {},
        ),
        (ValueError("v" * 600), "bad_request", "v" * 500, {}),
        (TypeError("not a str"), "bad_request", "not a str", {}),
        (
            OpError("key_too_large", "keys are at most 8 bytes", limit=8),
            "key_too_large",
            "keys are at most 8 bytes",
            {"limit": 8},
        ),
    ],
)
def test_an_operations_error_is_its_code_message_and_fields(
    exc: Exception, code: str, message: str, extra: dict[str, Any]
) -> None:
    assert error_frame(5, exc) == [ERROR, 5, code, message, extra]


def test_an_unexpected_error_is_internal_named_by_its_type_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, "aioelastic.serve"):
        frame = error_frame(5, KeyError("secret detail"))
    assert frame == [ERROR, 5, "internal", "the server failed: KeyError", {}]
    assert "session operation failed" in caplog.text
