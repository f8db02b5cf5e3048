"""The session's unary operations: one table, op name -> handler over the engine.

A handler takes the connection it was asked on, the request id and the request's arguments (a
list, as it came off the wire), validates them, applies the operation synchronously on the
:class:`~aioelastic.store.memory.MemoryEngine` and returns the answer's value (msgpack-able).
``write=True`` marks operations whose answer waits for the data directory's durability. Adding
an operation is one entry in :data:`OPS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import TxnTooLargeError
from .._txn import DeletePrefix, Put, Range, Txn
from ._frames import kv_to_wire, lease_status_to_wire, range_to_wire
from ._session_txn import plain_txn
from ._txn_wire import result_to_frame, txn_from_frame

if TYPE_CHECKING:
    from ._session_server import Connection

__all__ = ["OPS", "Op", "OpError", "bad"]


class OpError(Exception):
    """An error answered as ``[ERROR, id, code, message, extra]``."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


def bad(message: str) -> OpError:
    return OpError("bad_request", message[:500])


Handler = Callable[["Connection", int, list[Any]], Any]


@dataclass(frozen=True, slots=True)
class Op:
    handler: Handler
    #: the answer waits until the write is durable (with a data directory)
    write: bool = False


# -- argument checks ------------------------------------------------------------------------------


def arity(args: list[Any], n: int, op: str) -> None:
    if len(args) != n:
        raise bad(f"{op} takes {n} argument(s), got {len(args)}")


def key_arg(conn: Connection, value: Any, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise bad(f"a key must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise bad("the key must not be empty")
    limit = conn.hub.max_key_bytes
    if len(value) > limit // 4 and len(value.encode("utf-8", "surrogatepass")) > limit:
        raise OpError("key_too_large", f"keys are at most {limit} bytes (UTF-8)")
    return value


def value_arg(conn: Connection, value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise bad(f"a value must be bytes (msgpack bin), got {type(value).__name__}")
    if len(value) > conn.hub.max_value_bytes:
        raise OpError("value_too_large", f"values are at most {conn.hub.max_value_bytes} bytes")
    return value


def int_arg(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{name} must be an integer >= {minimum}, got {type(value).__name__}")
    if value < minimum or value >= 2**63:
        raise bad(f"{name} must be an integer in [{minimum}, 2**63), got {value}")
    return value


def seconds_arg(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"{name} must be a number of seconds, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0 or number > 1e9:
        raise bad(f"{name} must be a finite number of seconds in (0, 1e9], got {value!r}")
    return number


# -- the operations --------------------------------------------------------------------------------


def _get(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 1, "get")
    kv = conn.hub.engine.get(key_arg(conn, args[0]))
    return None if kv is None else kv_to_wire(kv)


def _range(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 2, "range")
    prefix = key_arg(conn, args[0], allow_empty=True)
    limit = None if args[1] is None else int_arg(args[1], "limit", 1)
    return range_to_wire(conn.hub.engine.range(prefix, limit))


def _revision(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 0, "revision")
    return conn.hub.engine.revision


def _put(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 3, "put")
    key, value = key_arg(conn, args[0]), value_arg(conn, args[1])
    return conn.hub.engine.put(key, value, int_arg(args[2], "lease", 0))


def _delete(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 2, "delete")
    prefix = args[1] is True
    return conn.hub.engine.delete(key_arg(conn, args[0], allow_empty=prefix), prefix)


def _cas(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 4, "cas")
    key = key_arg(conn, args[0])
    expected = int_arg(args[1], "expected_mod_revision", 0)
    value = value_arg(conn, args[2])
    result = conn.hub.engine.compare_and_swap(key, expected, value, int_arg(args[3], "lease", 0))
    return [result.succeeded, result.revision, None if result.kv is None else kv_to_wire(result.kv)]


def _cad(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 2, "cad")
    key = key_arg(conn, args[0])
    result = conn.hub.engine.compare_and_delete(key, int_arg(args[1], "expected_mod_revision", 1))
    return [result.succeeded, result.revision, None if result.kv is None else kv_to_wire(result.kv)]


def _add(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 2, "add")
    delta = args[1]
    if isinstance(delta, bool) or not isinstance(delta, int) or abs(delta) >= 2**63:
        raise bad("delta must be an integer of at most 64 bits")
    return conn.hub.engine.add(key_arg(conn, args[0]), delta)


def _txn(conn: Connection, rid: int, args: list[Any]) -> Any:
    hub = conn.hub
    engine = hub.engine
    # one pass, the usual case: the branch that will not run is checked, not built (the engine
    # applies the transaction at once, as of the same state)
    txn = plain_txn(args, hub.max_key_bytes, hub.max_value_bytes, engine.compares_hold)
    if txn is None:
        txn = _checked_txn(conn, args)  # the full checks, and their errors
    return result_to_frame(engine.txn(txn))  # LeaseNotFoundError -> its error frame


def _checked_txn(conn: Connection, args: list[Any]) -> Txn:
    try:
        txn = txn_from_frame(args)
    except TxnTooLargeError as exc:
        raise OpError(
            "txn_too_large", str(exc), limit=exc.limit, maximum=exc.maximum, size=exc.size
        ) from None
    except (TypeError, ValueError) as exc:
        raise bad(f"txn: {exc}") from None
    for item in (*txn.compare, *txn.success, *txn.failure):
        if isinstance(item, (Range, DeletePrefix)):
            key_arg(conn, item.prefix, allow_empty=True)
        else:
            key_arg(conn, item.key)
        if isinstance(item, Put):
            value_arg(conn, item.value)
    return txn


def _compact(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 1, "compact")
    conn.hub.engine.compact(int_arg(args[0], "revision", 1))
    return conn.hub.engine.compact_revision


def _lease_grant(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 1, "lease_grant")
    grant = conn.hub.engine.lease_grant(seconds_arg(args[0], "ttl"))
    conn.hub.own_lease(conn.state, grant.id)  # bound to this session (revoked when it ends)
    return [grant.id, grant.ttl]


def _lease_keep_alive(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 1, "lease_keep_alive")
    return conn.hub.engine.lease_keep_alive(int_arg(args[0], "lease", 1))


def _lease_revoke(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 1, "lease_revoke")
    conn.hub.engine.lease_revoke(int_arg(args[0], "lease", 1))
    return conn.hub.engine.revision


def _lease_ttl(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 1, "lease_ttl")
    return lease_status_to_wire(conn.hub.engine.lease_time_to_live(int_arg(args[0], "lease", 1)))


def _watch(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 3, "watch")
    prefix = key_arg(conn, args[0], allow_empty=True)
    start = None if args[1] is None else int_arg(args[1], "start_revision", 1)
    snapshot = args[2] is True
    if snapshot and start is not None:
        raise bad("a snapshot reads the prefix now: it takes no start_revision")
    return conn.open_watch(rid, prefix, start, snapshot)


def _unwatch(conn: Connection, rid: int, args: list[Any]) -> Any:
    arity(args, 1, "unwatch")
    conn.close_watch(int_arg(args[0], "watch id", 1))
    return None


OPS: dict[str, Op] = {
    "get": Op(_get),
    "range": Op(_range),
    "revision": Op(_revision),
    "put": Op(_put, write=True),
    "delete": Op(_delete, write=True),
    "cas": Op(_cas, write=True),
    "cad": Op(_cad, write=True),
    "add": Op(_add, write=True),
    "txn": Op(_txn, write=True),
    "compact": Op(_compact, write=True),
    "lease_grant": Op(_lease_grant, write=True),
    "lease_keep_alive": Op(_lease_keep_alive),
    "lease_revoke": Op(_lease_revoke, write=True),
    "lease_ttl": Op(_lease_ttl),
    "watch": Op(_watch),
    "unwatch": Op(_unwatch),
}
