"""The http client's errors for its callers (``store/http/_session_errors.py``): each error
frame's code as its aioelastic error, with the figures its ``extra`` carries; a request's
deadline and a lost connection, a write's outcome unknown, a read's retried or not.

Pinned error by error and word by word: a caller's ``except`` clause, and the person reading
the message, depend on both (``tests/test_http_client.py`` reaches them over a real server)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from aioelastic.errors import (
    CompactedError,
    LeaseNotFoundError,
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
    StoreTimeoutError,
    TxnTooLargeError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
)
from aioelastic.store.http._session_errors import (
    Refused,
    describe,
    error_from_frame,
    lost_error,
    timed_out,
)

URL = "http://127.0.0.1:9"


def session(*, closed: bool = False) -> Any:
    return SimpleNamespace(closed=closed, url=URL, request_timeout=2.5)


def test_a_call_is_named_with_its_key_cut_short() -> None:
    assert describe("range", None) == "range"
    assert describe("get", "a/b") == "get 'a/b'"
    assert describe("put", "k" * 300) == f"put {'k' * 200!r}"


def test_the_error_frames_with_figures_keep_them() -> None:
    lease = error_from_frame("lease_not_found", "no", {"lease": 255}, "put 'k'", write=True)
    assert type(lease) is LeaseNotFoundError
    assert lease.lease_id == 255
    compacted = error_from_frame(
        "compacted", "old", {"requested_revision": 3, "compact_revision": 9}, "watch", write=False
    )
    assert type(compacted) is CompactedError
    assert (compacted.requested_revision, compacted.compact_revision) == (3, 9)
    large = error_from_frame(
        "txn_too_large", "big", {"limit": "bytes", "maximum": 100, "size": 120}, "txn", write=True
    )
    assert type(large) is TxnTooLargeError
    assert (large.limit, large.maximum, large.size) == ("bytes", 100, 120)
    assert str(large) == (
        "transaction too large: the transaction (as the server counts it) has 120 bytes, the "
        "limit is 100 (max_txn_bytes); split it into smaller transactions"
    )


@pytest.mark.parametrize("extra", [{}, None, "not a dict", [1]])
def test_figures_missing_from_the_extra_are_zero(extra: Any) -> None:
    lease = error_from_frame("lease_not_found", "no", extra, "put", write=True)
    assert isinstance(lease, LeaseNotFoundError)
    assert lease.lease_id == 0
    compacted = error_from_frame("compacted", "old", extra, "watch", write=False)
    assert isinstance(compacted, CompactedError)
    assert (compacted.requested_revision, compacted.compact_revision) == (0, 0)
    large = error_from_frame("txn_too_large", "big", extra, "txn", write=True)
    assert isinstance(large, TxnTooLargeError)
    assert (large.limit, large.maximum, large.size) == ("ops", 0, 0)


@pytest.mark.parametrize(
    ("code", "write", "kind", "said"),
    [
        ("value_too_large", True, ValueTooLargeError, "put 'k': too big"),
        ("key_too_large", False, ValueTooLargeError, "put 'k': too big"),
        ("bad_request", True, ValueError, "put 'k': too big"),
        ("unauthorized", False, StoreAuthError, "put 'k': too big"),
        ("storage_error", True, WriteOutcomeUnknownError, "put 'k': too big"),
        ("storage_error", False, StoreConnectionError, "put 'k': too big (storage_error)"),
        ("frob", True, StoreConnectionError, "put 'k': too big (frob)"),
        (None, False, StoreConnectionError, "put 'k': too big (None)"),
    ],
)
def test_each_other_code_is_its_error_with_the_servers_words(
    code: Any, write: bool, kind: type[Exception], said: str
) -> None:
    error = error_from_frame(code, "too big", {}, "put 'k'", write=write)
    assert type(error) is kind
    assert str(error) == said


def test_a_refusal_keeps_its_frame_and_maps_it_when_asked() -> None:
    refused = Refused("lease_not_found", "gone", {"lease": 7})
    assert (refused.code, refused.message, refused.extra) == (
        "lease_not_found",
        "gone",
        {"lease": 7},
    )
    assert refused.args == ("lease_not_found", "gone")
    error = refused.error("put 'k'", write=True)
    assert type(error) is LeaseNotFoundError
    assert error.lease_id == 7
    stored = Refused("storage_error", "disk full", {})
    assert type(stored.error("put 'k'", write=True)) is WriteOutcomeUnknownError
    read = stored.error("get 'k'", write=False)
    assert type(read) is StoreConnectionError
    assert str(read) == "get 'k': disk full (storage_error)"


def test_a_deadline_passed_says_whether_a_write_may_have_applied() -> None:
    write = timed_out(session(), "put 'k'", True)
    assert type(write) is WriteTimeoutError
    assert str(write) == (
        f"put 'k' timed out: sent to {URL}, no answer within the 2.5s deadline; it may or may "
        "not have applied"
    )
    read = timed_out(session(), "get 'k'", False)
    assert type(read) is StoreTimeoutError
    assert str(read) == f"get 'k' timed out ({URL})"
    for write_ in (True, False):
        closed = timed_out(session(closed=True), "get 'k'", write_)
        assert type(closed) is StoreClosedError
        assert str(closed) == "the store was closed during get 'k'"


def test_a_lost_connection_fails_a_write_and_a_last_read_and_retries_the_others() -> None:
    lost = ConnectionResetError("reset by peer")
    write = lost_error(session(), lost, "put 'k'", True, last=False)
    assert type(write) is WriteOutcomeUnknownError
    assert str(write) == (
        f"put 'k': the session to {URL} was lost after the request was sent (reset by peer); "
        "it may or may not have applied"
    )
    assert type(lost_error(session(), lost, "put 'k'", True, last=True)) is WriteOutcomeUnknownError
    last = lost_error(session(), lost, "get 'k'", False, last=True)
    assert type(last) is StoreConnectionError
    assert str(last) == f"get 'k': the session to {URL} was lost (reset by peer)"
    assert lost_error(session(), lost, "get 'k'", False, last=False) is None
    closed = lost_error(session(closed=True), lost, "get 'k'", False, last=False)
    assert type(closed) is StoreClosedError
    assert str(closed) == "the store was closed during get 'k'"
