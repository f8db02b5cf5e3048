"""The transaction API itself: the records, the builders, the rules every backend shares
(limits, one write per key) and the reference meaning of a compare."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic import TxnTooLargeError, ValueTooLargeError
from aioelastic.store import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    KeyValue,
    MemoryStore,
    Put,
    Range,
)
from aioelastic.store._txn import TxnOp, check_txn

KV = KeyValue("k", b"m", create_revision=3, mod_revision=5, version=2, lease=7)


def test_builders_make_plain_compares() -> None:
    assert (Compare.value("k") == b"x") == Compare("k", "value", "==", b"x")
    assert (Compare.version("k") != 0) == Compare("k", "version", "!=", 0)
    assert (Compare.create_revision("k") < 4) == Compare("k", "create_revision", "<", 4)
    assert (Compare.mod_revision("k") > 4) == Compare("k", "mod_revision", ">", 4)
    assert (Compare.lease("k") == 7) == Compare("k", "lease", "==", 7)
    assert repr(Compare.value("k")) == "Compare.value('k')"


@pytest.mark.parametrize(
    ("compare", "expected"),
    [
        (Compare.value("k") == b"m", True),
        (Compare.value("k") != b"m", False),
        (Compare.value("k") < b"n", True),
        (Compare.value("k") > b"l", True),
        (Compare.value("k") > b"m", False),
        (Compare.version("k") == 2, True),
        (Compare.create_revision("k") < 3, False),
        (Compare.mod_revision("k") > 4, True),
        (Compare.lease("k") != 7, False),
    ],
)
def test_compare_holds_on_a_present_key(compare: Compare, expected: bool) -> None:
    assert compare.holds(KV) is expected


def test_an_absent_key_has_zeros_and_no_value() -> None:
    assert (Compare.version("k") == 0).holds(None)
    assert (Compare.mod_revision("k") == 0).holds(None)
    assert (Compare.lease("k") == 0).holds(None)
    assert not (Compare.create_revision("k") > 0).holds(None)
    # etcd: every compare of an absent key's value is false, != included
    assert not (Compare.value("k") == b"").holds(None)
    assert not (Compare.value("k") != b"x").holds(None)


def test_bad_records_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="compare target"):
        Compare("k", "size", "==", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compare op"):
        Compare("k", "version", ">=", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compare operand must be bytes"):
        Compare.value("k") == "text"  # noqa: B015
    with pytest.raises(TypeError, match="operand of version must be an int"):
        Compare.version("k") == b"1"  # noqa: B015
    with pytest.raises(ValueError, match="key must not be empty"):
        Put("", b"v")
    with pytest.raises(TypeError, match="value must be bytes"):
        Put("k", "v")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit must be >= 1"):
        Range("p", limit=0)
    with pytest.raises(TypeError, match=r"success\[\] must be"):
        check_txn([], ["put k"], [])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="compare must be a list"):
        check_txn("k", [], [])  # type: ignore[arg-type]


def test_one_write_per_key_per_branch() -> None:
    with pytest.raises(ValueError, match="put twice"):
        check_txn([], [Put("k", b"1"), Put("k", b"2")], [])
    with pytest.raises(ValueError, match="both put and deleted"):
        check_txn([], [], [Delete("k"), Put("k", b"2")])
    with pytest.raises(ValueError, match="both put and deleted"):
        check_txn([], [DeletePrefix("a/"), Put("a/k", b"2")], [])
    # the same key in both branches, reads and overlapping deletes are fine
    check_txn([], [Put("k", b"1"), Get("k")], [Put("k", b"2"), Delete("j"), DeletePrefix("j")])
    check_txn([], [Delete("k"), DeletePrefix("k"), DeletePrefix("")], [])


def test_limits_name_the_limit() -> None:
    many = [Get(f"k{i}") for i in range(MAX_TXN_OPS + 1)]
    check_txn([], many[:-1], many[:-1])
    with pytest.raises(TxnTooLargeError, match=r"failure list has 129 operations.*max_txn_ops"):
        check_txn([], [], many)
    compares = [Compare.version(f"k{i}") == 0 for i in range(MAX_TXN_OPS + 1)]
    with pytest.raises(TxnTooLargeError) as info:
        check_txn(compares, [], [])
    assert (info.value.limit, info.value.maximum, info.value.size) == ("ops", 128, 129)
    half = b"x" * (MAX_TXN_BYTES // 2)
    with pytest.raises(TxnTooLargeError, match="max_txn_bytes") as info:
        check_txn([Compare.value("a") == half], [Put("b", half)], [])
    assert info.value.limit == "bytes"
    assert isinstance(info.value, ValueTooLargeError)
    assert isinstance(info.value, ValueError)


def test_a_refused_txn_applies_nothing() -> None:
    async def main() -> None:
        async with MemoryStore() as store:
            with pytest.raises(ValueError, match="put twice"):
                await store.txn(success=[Put("k", b"1"), Put("k", b"2")])
            assert await store.current_revision() == 0
            assert await store.get("k") is None

    asyncio.run(main())


def _reference_branch_rule(ops: list[TxnOp], branch: str) -> str | None:
    """etcd's one-write-per-key rule as check_txn stated it before its fast paths: the error
    message for the first offending put, or None."""
    puts = [op.key for op in ops if isinstance(op, Put)]
    deleted = {op.key for op in ops if isinstance(op, Delete)}
    prefixes = [op.prefix for op in ops if isinstance(op, DeletePrefix)]
    seen: set[str] = set()
    for key in puts:
        if key in seen:
            return f"txn {branch}: key {key!r} is put twice (one write per key)"
        if key in deleted or any(key.startswith(p) for p in prefixes):
            return f"txn {branch}: key {key!r} is both put and deleted"
        seen.add(key)
    return None


_keys = st.sampled_from(["a", "ab", "b", "bé"])
_ops = st.one_of(
    st.builds(Put, _keys, st.binary(max_size=3)),
    st.builds(Get, _keys),
    st.builds(Delete, _keys),
    st.builds(DeletePrefix, st.sampled_from(["a", "b", "x"])),
    st.builds(Range, st.sampled_from(["a", ""])),
)


@given(success=st.lists(_ops, max_size=5), failure=st.lists(_ops, max_size=5))
def test_the_one_write_per_key_rule_is_the_reference_rule(
    success: list[TxnOp], failure: list[TxnOp]
) -> None:
    expected = _reference_branch_rule(success, "success") or _reference_branch_rule(
        failure, "failure"
    )
    if expected is None:
        txn = check_txn((), success, failure)
        assert txn.success == tuple(success)
        assert txn.failure == tuple(failure)
    else:
        with pytest.raises(ValueError, match=re.escape(expected)) as info:
            check_txn((), success, failure)
        assert str(info.value) == expected
