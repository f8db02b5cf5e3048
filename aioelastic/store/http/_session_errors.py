"""The session's error frames as aioelastic errors (``[ERROR, id, code, message, extra]``)."""

from __future__ import annotations

from typing import Any

from ...errors import (
    CompactedError,
    LeaseNotFoundError,
    StoreAuthError,
    StoreConnectionError,
    TxnTooLargeError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
)

__all__ = ["Refused", "error_from_frame"]


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
