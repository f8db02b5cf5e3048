"""The session's ``txn`` arguments decoded in one pass, for the common case.

A rendezvous join is one transaction, and decoding it was the largest part of the server's CPU
per join: :func:`~._txn_wire.txn_from_frame` builds the operations, :func:`~.._txn.check_txn`
walks them again for the limits and etcd's one-write-per-key rule, and the session walks them a
third time for its key and value limits. :func:`plain_txn` does all of it in one walk for a
transaction that breaks no rule. It never decides a refusal: at the first thing it is not sure
of (a type, a limit, a rule) it returns None and the full path (``txn_from_frame`` and the
session's checks) answers, with its own error. So the full path stays the one definition of
what is refused and why; this one only accepts what the full path accepts, as the same
:class:`~.._txn.Txn` (``tests/test_http_session_txn.py`` holds the two to that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._txn import (
    _OPS,
    _TARGETS,
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    Put,
    Range,
    Txn,
    TxnOp,
)
from ._frames import slot_setters

__all__ = ["plain_txn"]

# The operations are made from their slots, as ``_frames.new_kv`` makes key-values: a frozen
# dataclass's ``__init__`` sets each field through ``object.__setattr__`` and then its
# ``__post_init__`` checks again what :func:`plain_txn` has just checked (a key that is a
# non-empty str, bytes, an int >= 0 that is not a bool, a known target and op). That was about
# half of the decode of a transaction. Same fields, so the same (equal) operations.
_new = object.__new__
_PUT_KEY, _PUT_VALUE, _PUT_LEASE = slot_setters(Put, ("key", "value", "lease"))
(_GET_KEY,) = slot_setters(Get, ("key",))
(_DELETE_KEY,) = slot_setters(Delete, ("key",))
(_DELETE_PREFIX,) = slot_setters(DeletePrefix, ("prefix",))
#: The operations of two items, ``[name, key]``, by name: the class and its key's setter.
_ONE_KEY: dict[str, tuple[type[Get] | type[Delete] | type[DeletePrefix], Callable[..., None]]] = {
    "get": (Get, _GET_KEY),
    "delete": (Delete, _DELETE_KEY),
    "delete_prefix": (DeletePrefix, _DELETE_PREFIX),
}
_RANGE_PREFIX, _RANGE_LIMIT = slot_setters(Range, ("prefix", "limit"))
_CMP_KEY, _CMP_TARGET, _CMP_OP, _CMP_OPERAND = slot_setters(
    Compare, ("key", "target", "op", "operand")
)
_TXN_COMPARE, _TXN_SUCCESS, _TXN_FAILURE = slot_setters(Txn, ("compare", "success", "failure"))


def _compare(key: str, target: str, op: str, operand: int | bytes) -> Compare:
    compare: Compare = _new(Compare)
    _CMP_KEY(compare, key)
    _CMP_TARGET(compare, target)
    _CMP_OP(compare, op)
    _CMP_OPERAND(compare, operand)
    return compare


def plain_txn(
    args: list[Any],
    max_key_bytes: int,
    max_value_bytes: int,
    holds: Callable[[tuple[Compare, ...]], bool] | None = None,
) -> Txn | None:
    """The :class:`Txn` of a ``txn`` op's arguments when they are plainly valid (every type
    exact, every key and value within the session's limits and the transaction's, no key put
    twice or put and deleted in one branch); None: let the full path judge.

    ``holds(compares)``: whether the compares hold now (the engine's answer, asked once they
    are decoded). The branch that will not run is then checked as fully but not built (its
    operations are ``()``): a rendezvous join's registration carries a driver claim whose
    compare fails for all but the first of N nodes, and its success branch is most of the
    transaction. Only for a transaction applied at once, before anything else can write.

    A transaction's size is bounded here as 4 bytes a key's code point (UTF-8's most) plus its
    values' bytes: within the limit, the exact size is too; over it, the full path counts."""
    if type(args) is not list or len(args) != 3:
        return None
    compares_in, success_in, failure_in = args
    if type(compares_in) is not list or len(compares_in) > MAX_TXN_OPS:
        return None
    key_room = max_key_bytes // 4  # a str of at most this many code points fits in UTF-8
    size = 0
    compares: list[Compare] = []
    for item in compares_in:
        if type(item) is not list or len(item) != 4:
            return None
        key, target, op, operand = item
        if type(key) is not str or not key or len(key) > key_room:
            return None
        if target not in _TARGETS or op not in _OPS:
            return None
        if target == "value":
            if type(operand) is not bytes:
                return None
            size += len(operand)
        elif type(operand) is not int or operand < 0:
            return None
        size += 4 * len(key)
        compares.append(_compare(key, target, op, operand))
    checked = tuple(compares)
    taken = None if holds is None else holds(checked)  # (None: build both branches)
    success = _branch(success_in, key_room, max_value_bytes, taken is not False)
    if success is None:
        return None
    failure = _branch(failure_in, key_room, max_value_bytes, taken is not True)
    if failure is None or size + success[1] + failure[1] > MAX_TXN_BYTES:
        return None
    txn: Txn = _new(Txn)
    _TXN_COMPARE(txn, checked)
    _TXN_SUCCESS(txn, success[0])
    _TXN_FAILURE(txn, failure[0])
    return txn


def _branch(
    items: Any, key_room: int, max_value_bytes: int, build: bool
) -> tuple[tuple[TxnOp, ...], int] | None:
    """A branch's operations (none unless ``build``) and bytes, or None (see plain_txn)."""
    if type(items) is not list or len(items) > MAX_TXN_OPS:
        return None
    ops: list[TxnOp] = []
    size = 0
    writes: list[str] = []  # keys put or deleted
    deletes_prefix = False
    op: TxnOp
    for item in items:
        if type(item) is not list:
            return None
        n = len(item)
        if n == 4:  # (an item is told by its length, then by its name)
            kind, key, value, lease = item
            if kind != "put" or type(value) is not bytes or len(value) > max_value_bytes:
                return None
            if type(lease) is not int or lease < 0:
                return None
            size += len(value)
            writes.append(key)
            if build:
                op = _new(Put)
                _PUT_KEY(op, key)
                _PUT_VALUE(op, value)
                _PUT_LEASE(op, lease)
                ops.append(op)
        elif n == 2:
            kind, key = item
            made = _ONE_KEY.get(kind) if type(kind) is str else None
            if made is None:
                return None
            cls = made[0]
            if cls is Delete:
                writes.append(key)
            elif cls is DeletePrefix:
                deletes_prefix = True
            if build:
                op = _new(cls)
                made[1](op, key)
                ops.append(op)
        elif n == 3:
            kind, key, limit = item
            if kind != "range" or (limit is not None and (type(limit) is not int or limit < 1)):
                return None
            if build:
                op = _new(Range)
                _RANGE_PREFIX(op, key)
                _RANGE_LIMIT(op, limit)
                ops.append(op)
        else:
            return None
        if type(key) is not str or len(key) > key_room or (not key and n != 3):
            return None  # (an empty key: a range's only; delete_prefix "" is the full path's)
        size += 4 * len(key)
    if (len(writes) > 1 or deletes_prefix) and not _one_write_each(writes, deletes_prefix, items):
        return None  # the full path says why
    return tuple(ops), size


def _one_write_each(writes: list[str], deletes_prefix: bool, items: list[list[Any]]) -> bool:
    """Whether the branch ``items`` (checked by :func:`_branch`) writes each key once (no key
    put twice, or put and deleted) and puts no key under a prefix it deletes."""
    if len(writes) > 1 and len(set(writes)) < len(writes):
        return False
    return not deletes_prefix or not _puts_under(items)


def _puts_under(items: list[list[Any]]) -> bool:
    """Whether a key put by ``items`` is under a prefix they delete."""
    prefixes = tuple(item[1] for item in items if len(item) == 2 and item[0] == "delete_prefix")
    return any(item[1].startswith(prefixes) for item in items if len(item) == 4)
