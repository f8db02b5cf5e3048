"""gRPC errors in aioelastic's terms: :func:`map_error` translates one, :func:`not_sent` tells an
UNAVAILABLE that provably never reached etcd (so even a write may go to the next member)."""

from __future__ import annotations

from ..errors import (
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
)
from ._endpoints import Endpoint
from ._rpc import grpc

__all__ = ["UNKNOWN", "map_error", "not_sent"]

UNKNOWN = "the write may or may not have been applied (read the key back)"

#: Codes with which etcd rejects a request before applying it (a failed write, not an unknown one).
_REJECTED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

#: Fragments of UNAVAILABLE details that say the request never reached etcd's state machine:
#: the connection could not be made, or a member without a leader refused it up front (we send
#: ``hasleader: true``, so such a member rejects before proposing).
_NOT_SENT = (
    "failed to connect",
    "connection refused",
    "connections to all backends failing",
    "etcdserver: no leader",
    "name resolution",
    "dns resolution failed",
)


def map_error(
    exc: grpc.aio.AioRpcError, method: str, *, write: bool, endpoint: Endpoint, closed: bool
) -> Exception:
    """Translate a gRPC error into aioelastic's hierarchy (callers special-case the rest);
    ``closed``: the client was closed (a cancelled call is then :class:`StoreClosedError`)."""
    code, details = exc.code(), exc.details() or ""
    where = f"etcd {method} at {endpoint}"
    if code is grpc.StatusCode.CANCELLED and closed:
        return StoreClosedError("the etcd client is closed")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        if write:
            return WriteTimeoutError(f"{where}: no answer before the deadline; {UNKNOWN}")
        return StoreTimeoutError(f"{where}: no answer before the deadline")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or (
        code is grpc.StatusCode.INVALID_ARGUMENT
        and ("authentication failed" in details or "user name is empty" in details)
    ):
        return StoreAuthError(f"{where}: {details}")
    if code is grpc.StatusCode.INVALID_ARGUMENT and "too large" in details:
        return ValueTooLargeError(f"{where}: {details}")
    if write and code not in _REJECTED:
        return WriteOutcomeUnknownError(f"{where}: {code.name}: {details}; {UNKNOWN}")
    if code is grpc.StatusCode.UNAVAILABLE:
        return StoreConnectionError(f"{where}: {details}")
    return StoreError(f"{where}: {code.name}: {details}")


def not_sent(details: str) -> bool:
    lowered = details.lower()
    return any(fragment in lowered for fragment in _NOT_SENT)
