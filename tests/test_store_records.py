"""The store's records made from their slots (:mod:`aioelastic.store._records`) are the records
their classes' constructors make: equal, of the same type, with every field set."""

from __future__ import annotations

import dataclasses

import pytest

from aioelastic.store import KeyValue
from aioelastic.store._records import (
    new_delete_result,
    new_event,
    new_get_result,
    new_kv,
    new_put_result,
    new_txn_result,
)
from aioelastic.store._txn import DeleteResult, GetResult, PutResult, TxnResult
from aioelastic.store._types import EventType, WatchEvent


def _same(made: object, built: object) -> None:
    assert type(made) is type(built)
    assert made == built
    assert hash(made) == hash(built)
    assert repr(made) == repr(built)


def test_each_record_is_the_one_its_constructor_makes() -> None:
    kv = KeyValue("k", b"v", 3, 5, 2, 7)
    prev = KeyValue("k", b"u", 3, 4, 1, 0)
    _same(new_kv("k", b"v", 3, 5, 2, 7), kv)
    _same(new_event(EventType.DELETE, kv), WatchEvent(EventType.DELETE, kv))
    _same(new_put_result(kv, prev), PutResult(kv, prev))
    _same(new_put_result(kv, None), PutResult(kv))
    _same(new_get_result(None), GetResult(None))
    _same(new_get_result(kv), GetResult(kv))
    _same(new_delete_result(2), DeleteResult(2))
    results = (PutResult(kv), DeleteResult(0))
    _same(new_txn_result(False, 9, results), TxnResult(False, 9, results))


def test_a_record_made_from_its_slots_is_still_frozen() -> None:
    kv = new_kv("k", b"v", 1, 1, 1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        kv.value = b"w"  # type: ignore[misc]
