"""Transaction evaluation for the memory engine: the compares, then one branch's operations
on the key space, at one revision (the engine commits the events, or takes the revision back
if there are none)."""

from __future__ import annotations

from ..errors import LeaseNotFoundError
from ._memory_keys import KeySpace
from ._records import new_delete_result, new_event, new_get_result, new_put_result
from ._txn import (
    Delete,
    DeletePrefix,
    Get,
    OpResult,
    Put,
    Range,
    Txn,
)
from ._types import EventType, RangeResult, WatchEvent

__all__ = ["evaluate_txn"]

_PUT = EventType.PUT


def evaluate_txn(
    keys: KeySpace, txn: Txn, revision: int
) -> tuple[bool, list[WatchEvent], list[OpResult], bool]:
    """Apply ``txn``'s branch at ``revision``: whether its compares held, the events of its
    writes, each operation's result, and whether there is a range among them (whose
    ``revision`` the engine sets: the transaction's, known once it is applied)."""
    data = keys.data
    succeeded = True
    for c in txn.compare:  # (a loop, not all() of a generator: one compare, as a rule)
        if not c.holds(data.get(c.key)):
            succeeded = False
            break
    ops = txn.success if succeeded else txn.failure
    leases = keys.leases
    for op in ops:  # refuse before applying anything, as etcd does
        if isinstance(op, Put) and op.lease and op.lease not in leases:
            raise LeaseNotFoundError(op.lease)
    events: list[WatchEvent] = []
    results: list[OpResult] = []
    ranged = False
    for op in ops:
        if isinstance(op, Put):
            prev = data.get(op.key)
            kv = keys.write(op.key, op.value, op.lease, revision)
            events.append(new_event(_PUT, kv))
            results.append(new_put_result(kv, prev))
        elif isinstance(op, Delete):
            if op.key in data:
                events.append(keys.remove(op.key, revision))
                results.append(new_delete_result(1))
            else:
                results.append(new_delete_result(0))
        elif isinstance(op, Get):
            results.append(new_get_result(data.get(op.key)))
        elif isinstance(op, DeletePrefix):
            gone = [keys.remove(key, revision) for key in keys.range_keys(op.prefix, None)[0]]
            events += gone
            results.append(new_delete_result(len(gone)))
        else:
            assert isinstance(op, Range)
            found, count = keys.range_keys(op.prefix, op.limit)
            kvs = tuple(data[key] for key in found)
            results.append(RangeResult(kvs, 0, count, len(kvs) < count))
            ranged = True
    return succeeded, events, results, ranged
