"""The session's errors for its callers: error frames (``[ERROR, id, code, message, extra]``), a
request's deadline, a connection lost after a request was sent."""

from __future__ import annotations

from typing import Any, Protocol

from ...errors import (
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

__all__ = ["Refused", "describe", "error_from_frame", "lost_error", "timed_out"]


class _Session(Protocol):
    closed: bool
    url: str
    request_timeout: float


def describe(what: str, key: str | None) -> str:
    """How an error names a call: ``what``, and the key it was about if any (``get 'a/b'``),
    formatted only when an error needs it, not for every call."""
    return what if key is None else f"{what} {key[:200]!r}"


def error_from_frame(code: Any, message: Any, extra: Any, what: str, *, write: bool) -> Exception:
    """The aioelastic error for an ``ERROR`` frame."""
    extra = extra if isinstance(extra, dict) else {}
    text = f"{what}: {message}"
    if code == "lease_not_found":
        return LeaseNotFoundError(int(extra.get("lease", 0)))
    if code == "compacted":
        return CompactedError(
            int(extra.get("requested_revision", 0)), int(extra.get("compact_revision", 0))
        )
    if code == "txn_too_large":
        return TxnTooLargeError(
            str(extra.get("limit", "ops")),
            int(extra.get("maximum", 0)),
            int(extra.get("size", 0)),
            "the transaction (as the server counts it)",
        )
    if code in ("value_too_large", "key_too_large"):
        return ValueTooLargeError(text)
    if code == "bad_request":
        return ValueError(text)
    if code == "unauthorized":
        return StoreAuthError(text)
    if code == "storage_error" and write:
        return WriteOutcomeUnknownError(text)
    return StoreConnectionError(f"{text} ({code})")


class Refused(Exception):
    """An ``ERROR`` answer, mapped to an aioelastic error by :meth:`error`."""

    def __init__(self, code: Any, message: Any, extra: Any) -> None:
        super().__init__(code, message)
        self.code, self.message, self.extra = code, message, extra

    def error(self, what: str, *, write: bool) -> Exception:
        return error_from_frame(self.code, self.message, self.extra, what, write=write)


def timed_out(session: _Session, what: str, write: bool) -> Exception:
    """The error for a request sent and not answered before its deadline."""
    if session.closed:
        return StoreClosedError(f"the store was closed during {what}")
    if write:
        # Sent, and no answer before the deadline: a timeout (StoreTimeoutError) whose
        # outcome is unknown (WriteOutcomeUnknownError), as with etcd.
        return WriteTimeoutError(
            f"{what} timed out: sent to {session.url}, no answer within the "
            f"{session.request_timeout:g}s deadline; it may or may not have applied"
        )
    return StoreTimeoutError(f"{what} timed out ({session.url})")


def lost_error(
    session: _Session, exc: Exception, what: str, write: bool, *, last: bool
) -> Exception | None:
    """The error for a request whose connection was lost after it was sent (``None``: a read,
    to be sent again)."""
    if session.closed:
        return StoreClosedError(f"the store was closed during {what}")
    if write:
        return WriteOutcomeUnknownError(
            f"{what}: the session to {session.url} was lost after the request was sent "
            f"({exc}); it may or may not have applied"
        )
    if last:
        return StoreConnectionError(f"{what}: the session to {session.url} was lost ({exc})")
    return None
