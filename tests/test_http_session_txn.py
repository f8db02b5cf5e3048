"""The session's one-pass ``txn`` decoder (``store/http/_session_txn.py``) against the full path
(``txn_from_frame`` and the session's key and value checks): it accepts only what the full path
accepts, as an equal :class:`Txn`, and a rendezvous join's transaction takes it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioelastic.store import KeyValue
from aioelastic.store._txn import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    Put,
    PutResult,
    Range,
    Txn,
    TxnResult,
)
from aioelastic.store.http._session_ops import OpError, _checked_txn
from aioelastic.store.http._session_txn import plain_txn
from aioelastic.store.http._txn_wire import _kv_frame, result_to_frame

MAX_KEY, MAX_VALUE = 64, 32

# keys around the limits, shared between ops so that the one-write-per-key rule is reached
keys = st.sampled_from(["", "a", "b", "a/b", "é", "k" * 15, "k" * 16, "k" * 17, "k" * 65])
anything = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 3), st.binary(max_size=40), st.text(max_size=3)
)
values = st.one_of(st.binary(max_size=40), st.just(bytearray(b"x")), anything)
ints = st.one_of(st.integers(-1, 3), st.booleans(), st.none(), st.just(2**64))


def _op() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.tuples(st.just("put"), keys, values, ints).map(list),
        st.tuples(st.just("get"), keys).map(list),
        st.tuples(st.just("delete"), keys).map(list),
        st.tuples(st.just("delete_prefix"), keys).map(list),
        st.tuples(st.just("range"), keys, ints).map(list),
        st.lists(anything, max_size=4),  # the wrong shape, an unknown op
        st.tuples(st.just("put"), keys, values).map(list),  # an arity off by one
        anything,
    )


compare = st.one_of(
    st.tuples(
        keys,
        st.sampled_from(["value", "version", "mod_revision", "create_revision", "lease", "x"]),
        st.sampled_from(["==", "!=", "<", ">", "="]),
        st.one_of(st.integers(-1, 3), st.binary(max_size=40), st.booleans(), st.none()),
    ).map(list),
    st.lists(anything, max_size=5),
)
branch = st.one_of(st.lists(_op(), max_size=4), anything)
frames = st.one_of(
    st.tuples(st.one_of(st.lists(compare, max_size=3), anything), branch, branch).map(list),
    st.lists(anything, max_size=4),
)


# mostly valid: what a client sends, with the odd key at a limit or one written twice
plain_keys = st.sampled_from(["a", "b", "a/b", "k" * 16, "k" * 17, "é"])
plain_op = st.one_of(
    st.tuples(st.just("put"), plain_keys, st.binary(max_size=33), st.integers(0, 2)).map(list),
    st.tuples(st.just("get"), plain_keys).map(list),
    st.tuples(st.just("delete"), plain_keys).map(list),
    st.tuples(st.just("delete_prefix"), st.sampled_from(["", "a", "a/", "k"])).map(list),
    st.tuples(st.just("range"), st.sampled_from(["", "a"]), st.none() | st.integers(0, 2)).map(
        list
    ),
)
plain_compare = st.tuples(
    plain_keys,
    st.sampled_from(["value", "version", "mod_revision"]),
    st.sampled_from(["==", "!=", "<", ">"]),
    st.integers(0, 3) | st.binary(max_size=8),
).map(list)
plain_frames = st.tuples(
    st.lists(plain_compare, max_size=2),
    st.lists(plain_op, max_size=4),
    st.lists(plain_op, max_size=3),
).map(list)


def _full(args: Any, max_key: int = MAX_KEY, max_value: int = MAX_VALUE) -> Txn | None:
    """The full path's Txn of ``args`` at these limits, or None where it refuses them."""
    hub = SimpleNamespace(max_key_bytes=max_key, max_value_bytes=max_value)
    conn: Any = SimpleNamespace(hub=hub)
    try:
        return _checked_txn(conn, args)
    except OpError:
        return None


@settings(max_examples=1500, deadline=None)
@given(st.one_of(frames, plain_frames))
def test_the_one_pass_decoder_accepts_only_what_the_full_path_does_as_the_same_txn(
    args: Any,
) -> None:
    fast = plain_txn(args, MAX_KEY, MAX_VALUE)
    if fast is not None:
        assert fast == _full(args)


JOIN = [
    [["r/c/driver", "mod_revision", "==", 12]],
    [
        ["put", "r/n/1/node", b'{"v":1,"kind":"node"}', 3],
        ["delete", "r/n/0/node"],
        ["put", "r/c/driver", b'{"v":1,"kind":"driver"}', 3],
    ],
    [["put", "r/n/1/node", b'{"v":1,"kind":"node"}', 3], ["delete", "r/n/0/node"]],
]


def test_a_joins_transaction_takes_the_one_pass_way() -> None:
    fast = plain_txn(JOIN, 1024, 1 << 20)
    assert fast is not None
    assert fast == _full(JOIN)


def test_a_rounds_write_with_its_garbage_takes_the_one_pass_way() -> None:
    """The driver's last write of a round (the members' records, the round record, the
    previous round's garbage deleted by prefix): one pass, not the one pass given up at the
    first ``delete_prefix`` and the full path after it (main)."""
    puts = [["put", f"r/m/5/node{i}", b'{"v":1,"kind":"member","k":1}', 3] for i in range(64)]
    garbage = [["delete_prefix", "d/4/"], ["delete_prefix", "r/r/4/"], ["delete_prefix", "r/m/3/"]]
    args = [
        [["r/c/round", "mod_revision", "==", 40], ["r/c/driver", "mod_revision", "==", 41]],
        [*puts, ["put", "r/c/round", b'{"v":2,"kind":"round"}', 0], *garbage],
        [],
    ]
    fast = plain_txn(args, 1024, 1 << 20)
    assert fast is not None
    assert fast == _full(args)


def test_the_one_pass_way_makes_its_operations_without_checking_them_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked: list[str] = []
    for cls in (Compare, Put, Get, Range, Delete, DeletePrefix):
        monkeypatch.setattr(cls, "__post_init__", lambda self: checked.append(type(self).__name__))
    args = [
        [["a", "version", ">", 0], ["b", "value", "==", b"x"]],
        [
            ["put", "k", b"v", 7],
            ["get", "a"],
            ["range", "p/", 3],
            ["delete", "d"],
            ["delete_prefix", "q/"],
        ],
        [["range", "", None]],
    ]
    fast = plain_txn(args, 1024, 1 << 20)
    assert checked == []  # plain_txn checked them: no second pass per operation
    monkeypatch.undo()
    assert fast is not None
    full = _full(args)
    assert fast == full
    assert [hash(op) for op in (*fast.compare, *fast.success, *fast.failure)] == [
        hash(op) for op in (*full.compare, *full.success, *full.failure)
    ]


@pytest.mark.parametrize(
    "args",
    [
        [[], [["put", "k", b"1", 0], ["put", "k", b"2", 0]], []],  # put twice
        [[], [["put", "k", b"1", 0], ["delete", "k"]], []],  # put and deleted
        [[], [["delete_prefix", "k"], ["put", "k/1", b"1", 0]], []],  # under a deleted prefix
        [[], [["put", "k/1", b"1", 0], ["delete_prefix", "k"]], []],  # (either order)
        [[], [["delete_prefix", ""]], []],  # everything: the full path's to judge
        [[], [["put", "k", b"x" * (MAX_VALUE + 1), 0]], []],  # over the value limit
        [[["k", "value", "==", bytearray(b"x")]], [], []],  # converted by the full path
    ],
)
def test_what_needs_a_closer_look_is_left_to_the_full_path(args: Any) -> None:
    assert plain_txn(args, MAX_KEY, MAX_VALUE) is None


@settings(max_examples=1500, deadline=None)
@given(st.one_of(frames, plain_frames), st.booleans())
def test_told_which_branch_runs_the_decoder_checks_both_and_builds_that_one(
    args: Any, taken: bool
) -> None:
    """With ``holds`` (the engine's word on the compares), the branch that will not run is
    checked as fully as before (the same transactions go to the full path) but not built."""
    asked: list[tuple[Compare, ...]] = []

    def holds(compares: tuple[Compare, ...]) -> bool:
        asked.append(compares)
        return taken

    lazy = plain_txn(args, MAX_KEY, MAX_VALUE, holds)
    both = plain_txn(args, MAX_KEY, MAX_VALUE)
    assert (lazy is None) == (both is None)
    if lazy is None or both is None:
        return
    assert asked == [both.compare]
    assert lazy.compare == both.compare
    assert lazy.success == (both.success if taken else ())
    assert lazy.failure == (() if taken else both.failure)


def test_a_join_that_finds_the_driver_claimed_builds_only_its_registration() -> None:
    """Every node but the first of a round finds ``c/driver`` claimed: its transaction's
    success branch (the claim) is checked, and only the registration is built."""
    lazy = plain_txn(JOIN, 1024, 1 << 20, lambda compares: False)
    full = _full(JOIN)
    assert lazy is not None
    assert full is not None
    assert lazy.success == ()
    assert lazy.failure == full.failure


@pytest.mark.parametrize("taken", [True, False])
def test_a_branch_not_built_is_still_refused_for_what_the_full_path_refuses(taken: bool) -> None:
    bad = [["put", "k", b"1", 0], ["put", "k", b"2", 0]]  # a key put twice
    good = [["put", "j", b"1", 0]]
    args = [[["k", "version", ">", 0]], good if taken else bad, bad if taken else good]
    assert plain_txn(args, MAX_KEY, MAX_VALUE, lambda compares: taken) is None
    assert _full(args) is None


def test_a_transaction_with_keys_beyond_ascii_takes_the_one_pass_way() -> None:
    """Keys are bounded at 4 bytes a code point (UTF-8's most), not refused for not being
    ASCII: a join whose run id is not ASCII is still one pass, as the same Txn."""
    args = [
        [["r/é/c/driver", "mod_revision", "==", 12]],
        [["put", "r/é/n/1/node", b"{}", 3], ["get", "r/é/ü"], ["range", "r/é/", None]],
        [["delete", "r/é/n/0/node"], ["delete_prefix", "r/é/m/"]],
    ]
    fast = plain_txn(args, 1024, 1 << 20)
    assert fast is not None
    assert fast == _full(args)


def test_a_txn_over_the_bound_at_4_bytes_a_code_point_is_left_to_the_full_path() -> None:
    """Three keys of 1,000 two-byte code points and a value that takes the exact UTF-8 size
    just over MAX_TXN_BYTES: counted a byte a code point the one pass would accept it; at 4 it
    leaves it to the full path, which refuses it as too large."""
    key_bytes = 4096
    keys = [f"{i}" + "é" * 1000 for i in range(3)]
    exact = sum(len(k.encode()) for k in keys)
    value = b"v" * (MAX_TXN_BYTES - exact + 1)
    args = [[], [["put", k, value if i == 0 else b"", 0] for i, k in enumerate(keys)], []]
    assert plain_txn(args, key_bytes, 1 << 21) is None
    conn: Any = SimpleNamespace(
        hub=SimpleNamespace(max_key_bytes=key_bytes, max_value_bytes=1 << 21)
    )
    with pytest.raises(OpError) as refused:
        _checked_txn(conn, args)
    assert refused.value.code == "txn_too_large"


def test_a_put_results_frame_is_its_key_values_frames() -> None:
    """``result_to_frame`` makes a put's key-value frame inline: the same as ``_kv_frame``."""
    kv = KeyValue("k", b"new", 3, 9, 4, 7)
    prev = KeyValue("k", b"old", 3, 8, 3, 7)
    frames = result_to_frame(TxnResult(True, 9, (PutResult(kv, prev), PutResult(kv, None))))
    assert frames == [
        True,
        9,
        [["put", _kv_frame(kv), _kv_frame(prev)], ["put", _kv_frame(kv), None]],
    ]


KEY_ROOM = MAX_KEY // 4  # code points of a key the one pass takes at MAX_KEY bytes


@pytest.mark.parametrize(
    "args",
    [
        [[[f"c{i}", "version", ">", 0] for i in range(MAX_TXN_OPS)], [], []],
        [[], [["get", f"g{i}"] for i in range(MAX_TXN_OPS)], []],
        [[], [], [["range", f"r{i}", None] for i in range(MAX_TXN_OPS)]],
        [[["k" * KEY_ROOM, "version", ">", 0]], [["get", "g" * KEY_ROOM]], []],
        [[], [["put", "p" * KEY_ROOM, b"v" * MAX_VALUE, 0]], [["delete", "d" * KEY_ROOM]]],
        [[], [["range", "r", 1], ["delete_prefix", "q" * KEY_ROOM]], []],
        [[["k", "lease", "==", 0]], [["put", "k", b"", 0]], []],
        # a prefix deleted beside a get and a put of keys it does not hold
        [[], [["get", "a"], ["delete_prefix", "z"], ["put", "ab", b"1", 0]], []],
        [[], [["put", "a", b"1", 0], ["delete", "b"], ["put", "c", b"2", 0]], []],
    ],
    ids=[
        "max-compares",
        "max-success",
        "max-failure",
        "keys-at-room",
        "value-at-limit",
        "limit-1",
        "lease-0",
        "prefix-beside-others",
        "writes-of-distinct-keys",
    ],
)
def test_the_one_pass_way_takes_a_txn_at_each_limit(args: Any) -> None:
    """At a limit, not over it: the one pass takes it (as the same Txn as the full path), not
    only a txn well inside every limit."""
    fast = plain_txn(args, MAX_KEY, MAX_VALUE)
    assert fast is not None
    assert fast == _full(args)


def _sized(values: list[int]) -> list[Any]:
    """A txn of two value compares, two puts on success and two on failure (six keys of two
    code points), whose values have these sizes, in that order."""
    c1, c2, s1, s2, f1, f2 = (b"v" * n for n in values)
    return [
        [["c1", "value", "==", c1], ["c2", "value", "==", c2]],
        [["put", "s1", s1, 0], ["put", "s2", s2, 0]],
        [["put", "f1", f1, 0], ["put", "f2", f2, 0]],
    ]


@pytest.mark.parametrize(
    "where",
    [(0, 1), (2, 3), (4, 5), (0, 1, 2, 3, 4, 5)],
    ids=["compares", "success", "failure", "all"],
)
def test_the_one_pass_way_takes_a_txn_of_exactly_the_byte_limit(where: tuple[int, ...]) -> None:
    """Bytes counted across the compares' values, both branches' values and every key at 4
    bytes a code point: a txn of exactly MAX_TXN_BYTES is taken (as the full path's Txn), one
    byte more is left to the full path."""
    room = MAX_TXN_BYTES - 6 * 2 * 4
    values = [0] * 6
    for at in where:
        values[at] = room // len(where)
    values[where[0]] += room - sum(values)
    exact = _sized(values)
    fast = plain_txn(exact, 1024, 1 << 21)
    assert fast is not None
    assert fast == _full(exact, 1024, 1 << 21)
    values[where[-1]] += 1
    assert plain_txn(_sized(values), 1024, 1 << 21) is None


@pytest.mark.parametrize(
    "args",
    [
        [[["k", "version", "=="]], [], []],  # a compare of three items
        [[["", "version", "==", 0]], [], []],  # an empty key
        [[[5, "version", "==", 0]], [], []],  # a key that is not a str
        [[["k" * (KEY_ROOM + 1), "version", ">", 0]], [], []],
        [[["c", "version", ">", 0]] * (MAX_TXN_OPS + 1), [], []],
        [[], [["get", "k", b"v", 0]], []],  # four items, not a put
        [[], [["put", "k", b"v", -1]], []],  # a negative lease
        [[], [["get", "k", None]], []],  # three items, not a range
        [[], [["range", "k", 0]], []],  # a limit under 1
        [[], [[[], "k"]], []],  # an op name that is not a str (nor hashable)
        [[], [["get", "g" * (KEY_ROOM + 1)]], []],
        [[], [["get", f"g{i}"] for i in range(MAX_TXN_OPS + 1)], []],
        [[], [], [["get", f"g{i}"] for i in range(MAX_TXN_OPS + 1)]],
    ],
)
def test_what_breaks_a_rule_is_left_to_the_full_path(args: Any) -> None:
    assert plain_txn(args, MAX_KEY, MAX_VALUE) is None
