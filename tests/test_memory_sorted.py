"""The memory engine's ordered keys (``store/_memory_sorted.py``) against a plain sorted list:
any sequence of adds, removes and ranges, with blocks small enough to split and empty often."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioelastic.store import _memory_sorted
from aioelastic.store._base import prefix_end
from aioelastic.store._memory_sorted import SortedKeys

keys = st.text(alphabet="abc/", max_size=4)
actions = st.lists(
    st.one_of(
        st.tuples(st.just("add"), keys),
        st.tuples(st.just("remove"), keys),
        st.tuples(st.just("range"), keys, st.none() | st.integers(1, 5)),
    ),
    max_size=200,
)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory_sorted, "BLOCK", 4)
    return


def _model_range(model: list[str], prefix: str, limit: int | None) -> tuple[list[str], int]:
    lo = bisect.bisect_left(model, prefix)
    end = prefix_end(prefix)
    hi = len(model) if end is None else bisect.bisect_left(model, end)
    count = max(0, hi - lo)
    return model[lo : lo + (count if limit is None else min(count, limit))], count


@settings(max_examples=400, deadline=None)
@given(st.lists(keys, unique=True).map(sorted), actions)
def test_sorted_keys_do_what_one_sorted_list_does(
    start: list[str], steps: list[tuple[object, ...]]
) -> None:
    model = list(start)
    keys_ = SortedKeys(start)
    for step in steps:
        key = step[1]
        assert isinstance(key, str)
        if step[0] == "add" and key not in model:
            bisect.insort(model, key)
            keys_.add(key)
        elif step[0] == "remove" and key in model:
            model.remove(key)
            keys_.remove(key)
        elif step[0] == "range":
            limit = step[2]
            assert limit is None or isinstance(limit, int)
            assert keys_.range(key, prefix_end(key), limit) == _model_range(model, key, limit)
        assert len(keys_) == len(model)
    assert list(keys_) == model
    assert keys_.range("", None, None) == (model, len(model))


def test_a_block_past_its_bound_splits_and_an_empty_one_goes() -> None:
    keys_ = SortedKeys()
    for key in "gfedcba":
        keys_.add(key)
    assert keys_._blocks == [["a", "b", "c", "d"], ["e", "f", "g"]]  # 5 keys in one: split
    assert keys_._lasts == ["d", "g"]
    for key in "gfe":
        keys_.remove(key)
    assert keys_._blocks == [["a", "b", "c", "d"]]
    assert keys_._lasts == ["d"]
