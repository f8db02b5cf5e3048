"""The store's records made from their slots: key-values, events and results on the hot paths.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``: about three
times the cost of setting its slot. The memory engine makes a key-value and an event per write
and a result per operation (a rendezvous join's transaction: seven records, most of the
engine's work for it), the session's wire code as many per answer: they are made here, with the
same fields and the same (equal) result as the class's own constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from ._txn import DeleteResult, GetResult, OpResult, PutResult, TxnResult
from ._types import EventType, KeyValue, WatchEvent

__all__ = [
    "new_delete_result",
    "new_event",
    "new_get_result",
    "new_kv",
    "new_put_result",
    "new_record",
    "new_txn_result",
    "slot_setters",
]


def slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of the frozen dataclass ``cls``'s fields, which must be ``names`` in
    order (checked at import: a field added to ``cls`` must be added here too)."""
    have = tuple(f.name for f in fields(cls))
    if have != names:
        raise AssertionError(f"{cls.__name__}'s fields are {have}, not {names}")
    return tuple(cls.__dict__[name].__set__ for name in names)


_new = new_record = object.__new__
_KV_SET = slot_setters(
    KeyValue, ("key", "value", "create_revision", "mod_revision", "version", "lease")
)
_EVENT_SET = slot_setters(WatchEvent, ("type", "kv"))
_PUT_SET = slot_setters(PutResult, ("kv", "prev_kv"))
_GET_SET = slot_setters(GetResult, ("kv",))
(_DELETED_SET,) = slot_setters(DeleteResult, ("deleted",))
_TXN_SET = slot_setters(TxnResult, ("succeeded", "revision", "results"))


def new_kv(key: str, value: bytes, create: int, mod: int, version: int, lease: int) -> KeyValue:
    """``KeyValue(key, value, create, mod, version, lease)``, made at a third of its cost."""
    kv: KeyValue = _new(KeyValue)
    set_key, set_value, set_create, set_mod, set_version, set_lease = _KV_SET
    set_key(kv, key)
    set_value(kv, value)
    set_create(kv, create)
    set_mod(kv, mod)
    set_version(kv, version)
    set_lease(kv, lease)
    return kv


def new_event(kind: EventType, kv: KeyValue) -> WatchEvent:
    """``WatchEvent(kind, kv)``, made from its slots."""
    event: WatchEvent = _new(WatchEvent)
    _EVENT_SET[0](event, kind)
    _EVENT_SET[1](event, kv)
    return event


def new_put_result(kv: KeyValue, prev_kv: KeyValue | None) -> PutResult:
    result: PutResult = _new(PutResult)
    _PUT_SET[0](result, kv)
    _PUT_SET[1](result, prev_kv)
    return result


def new_get_result(kv: KeyValue | None) -> GetResult:
    result: GetResult = _new(GetResult)
    _GET_SET[0](result, kv)
    return result


def new_delete_result(deleted: int) -> DeleteResult:
    result: DeleteResult = _new(DeleteResult)
    _DELETED_SET(result, deleted)
    return result


def new_txn_result(succeeded: bool, revision: int, results: tuple[OpResult, ...]) -> TxnResult:
    result: TxnResult = _new(TxnResult)
    set_succeeded, set_revision, set_results = _TXN_SET
    set_succeeded(result, succeeded)
    set_revision(result, revision)
    set_results(result, results)
    return result
