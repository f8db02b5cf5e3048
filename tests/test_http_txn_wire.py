"""The wire forms of a transaction, as pure functions (``store/http/_txn_wire.py``): the REST
route's JSON, read and answered by the server, and the session's msgpack arrays, both ways.

``tests/test_http_txn.py`` sends both over a real server; these pin every field and every
refusal's words, so that a field renamed or a result decoded from the wrong slot fails here."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from aioelastic.store import (
    Compare,
    Delete,
    DeletePrefix,
    DeleteResult,
    Get,
    GetResult,
    KeyValue,
    Put,
    PutResult,
    Range,
    RangeResult,
    TxnResult,
)
from aioelastic.store.http._txn_wire import (
    kv_to_json,
    result_from_frame,
    result_to_frame,
    result_to_json,
    txn_from_frame,
    txn_from_json,
    txn_to_frame,
)

KV = KeyValue("k", b"\x00v\xff", 3, 7, 2, 9)
PREV = KeyValue("k", b"old", 3, 5, 1, 0)
KV_JSON = {
    "key": "k",
    "create_revision": 3,
    "mod_revision": 7,
    "version": 2,
    "lease": 9,
    "value_b64": base64.b64encode(b"\x00v\xff").decode(),
}


#: one result of each kind (a put with and without its previous key-value, a get that found one
#: and one that did not, a range of two and an empty one, a delete)
EVERY_RESULT = (
    PutResult(KV, PREV),
    PutResult(KV, None),
    GetResult(KV),
    GetResult(None),
    RangeResult((KV, PREV), 12, 5, True),
    RangeResult((), 12, 0, False),
    DeleteResult(3),
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- JSON: the request ------------------------------------------------------------------------


def test_every_json_operation_and_compare_is_read_into_its_txn() -> None:
    txn = txn_from_json(
        {
            "compare": [
                {"key": "a", "target": "value", "op": "==", "value_b64": b64(b"x")},
                {"key": "b", "target": "version", "op": ">", "operand": 2},
            ],
            "success": [
                {"op": "put", "key": "p", "value_b64": b64(b"1"), "lease": 5},
                {"op": "put", "key": "q"},
                {"op": "get", "key": "g"},
                {"op": "range", "prefix": "r/", "limit": 4},
                {"op": "range", "prefix": "s/"},
            ],
            "failure": [{"op": "delete", "key": "d"}, {"op": "delete_prefix", "prefix": "e/"}],
        }
    )
    assert list(txn.compare) == [Compare("a", "value", "==", b"x"), Compare("b", "version", ">", 2)]
    assert list(txn.success) == [
        Put("p", b"1", 5),
        Put("q", b"", 0),
        Get("g"),
        Range("r/", 4),
        Range("s/", None),
    ]
    assert list(txn.failure) == [Delete("d"), DeletePrefix("e/")]


def test_an_empty_json_body_is_an_empty_txn() -> None:
    txn = txn_from_json({})
    assert (list(txn.compare), list(txn.success), list(txn.failure)) == ([], [], [])


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"a": 1, "f": 1, "e": 1, "d": 1, "c": 1, "b": 1, "compare": []},
         "unknown field(s) ['a', 'b', 'c', 'd', 'e']: compare, success, failure"),
        ({"compare": {}}, "field 'compare' must be a list"),
        ({"success": "x"}, "field 'success' must be a list"),
        ({"failure": 1}, "field 'failure' must be a list"),
        ({"compare": [3]}, "compare[] must be a JSON object, got int"),
        ({"success": [[]]}, "success[] must be a JSON object, got list"),
        ({"failure": [None]}, "failure[] must be a JSON object, got NoneType"),
        ({"success": [{"op": "frob"}]},
         "success[].op must be put, get, range, delete or delete_prefix, got 'frob'"),
        ({"failure": [{"op": "y" * 50}]},
         f"failure[].op must be put, get, range, delete or delete_prefix, got '{'y' * 40}'"),
        ({"success": [{"key": "k"}]},
         "success[].op must be put, get, range, delete or delete_prefix, got 'None'"),
        ({"success": [{"op": "put", "key": "k", "value_b64": 5}]},
         "value_b64 must be a base64 string"),
        ({"success": [{"op": "put", "key": "k", "value_b64": "!!"}]},
         "value_b64 is not valid base64"),
        ({"compare": [{"key": "k", "target": "value", "op": "==", "value_b64": "a"}]},
         "value_b64 is not valid base64"),
        ({"compare": [{"key": "k", "target": "value", "op": "==", "value_b64": []}]},
         "value_b64 must be a base64 string"),
    ],
)  # fmt: skip
def test_a_json_txn_that_is_not_one_is_refused_saying_what_is_wrong(
    body: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        txn_from_json(body)


def test_a_value_compare_without_a_value_compares_with_empty_bytes() -> None:
    txn = txn_from_json({"compare": [{"key": "k", "target": "value", "op": "!="}]})
    assert list(txn.compare) == [Compare("k", "value", "!=", b"")]


# -- JSON: the answer -------------------------------------------------------------------------


def test_a_kv_in_json_has_every_field_and_its_value_in_base64() -> None:
    assert kv_to_json(KV) == KV_JSON


def test_every_result_is_answered_in_json() -> None:
    result = TxnResult(True, 12, EVERY_RESULT)
    prev = {
        "key": "k",
        "create_revision": 3,
        "mod_revision": 5,
        "version": 1,
        "lease": 0,
        "value_b64": "b2xk",
    }
    assert result_to_json(result) == {
        "succeeded": True,
        "revision": 12,
        "results": [
            {"op": "put", "kv": KV_JSON, "prev_kv": prev},
            {"op": "put", "kv": KV_JSON, "prev_kv": None},
            {"op": "get", "kv": KV_JSON},
            {"op": "get", "kv": None},
            {"op": "range", "kvs": [KV_JSON, prev], "count": 5, "more": True},
            {"op": "range", "kvs": [], "count": 0, "more": False},
            {"op": "delete", "deleted": 3},
        ],
    }
    assert result_to_json(TxnResult(False, 4, ())) == {
        "succeeded": False,
        "revision": 4,
        "results": [],
    }


# -- the session's frames ---------------------------------------------------------------------


def test_every_operation_goes_through_a_frame_and_back() -> None:
    txn = txn_from_frame(
        [
            [["a", "value", "==", b"x"], ["b", "version", ">", 2]],
            [["put", "p", b"1", 5], ["get", "g"], ["range", "r/", 4], ["range", "s/", None]],
            [["delete", "d"], ["delete_prefix", "e/"]],
        ]
    )
    assert list(txn.compare) == [Compare("a", "value", "==", b"x"), Compare("b", "version", ">", 2)]
    assert list(txn.success) == [Put("p", b"1", 5), Get("g"), Range("r/", 4), Range("s/", None)]
    assert list(txn.failure) == [Delete("d"), DeletePrefix("e/")]
    assert txn_to_frame(txn) == [
        [["a", "value", "==", b"x"], ["b", "version", ">", 2]],
        [["put", "p", b"1", 5], ["get", "g"], ["range", "r/", 4], ["range", "s/", None]],
        [["delete", "d"], ["delete_prefix", "e/"]],
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([[], []], "txn takes [compares, success, failure], three arrays"),
        ([[], [], [], []], "txn takes [compares, success, failure], three arrays"),
        ([[], {}, []], "txn takes [compares, success, failure], three arrays"),
        ([["k", "version", "==", 0], [], []], "a compare is [key, target, op, operand]"),
        ([[["k", "version", "=="]], [], []], "a compare is [key, target, op, operand]"),
        ([[], ["get"], []], "success[] must be an array [op, ...]"),
        ([[], [[]], []], "success[] must be an array [op, ...]"),
        ([[], [], [[5, "k"]]], "failure[] must be an array [op, ...]"),
        ([[], [["frob", "k"]], []], "success[]: unknown op 'frob'"),
        ([[], [], [["z" * 50]]], f"failure[]: unknown op '{'z' * 40}'"),
        ([[], [["get", "k", "extra"]], []], "success[]: get takes 1 argument(s)"),
        ([[], [], [["put", "k", b"v"]]], "failure[]: put takes 3 argument(s)"),
        ([[], [["range", "p"]], []], "success[]: range takes 2 argument(s)"),
    ],
)
def test_a_txn_frame_that_is_not_one_is_refused_saying_what_is_wrong(
    args: list[Any], said: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        txn_from_frame(args)


def test_every_result_goes_through_a_frame_and_back() -> None:
    result = TxnResult(True, 12, EVERY_RESULT)
    frame = result_to_frame(result)
    kv = ["k", b"\x00v\xff", 3, 7, 2, 9]
    prev = ["k", b"old", 3, 5, 1, 0]
    assert frame == [
        True,
        12,
        [
            ["put", kv, prev],
            ["put", kv, None],
            ["get", kv],
            ["get", None],
            ["range", 5, True, [kv, prev]],
            ["range", 0, False, []],
            ["delete", 3],
        ],
    ]
    assert result_from_frame(frame) == result
    assert result_from_frame([0, 4, []]) == TxnResult(False, 4, ())


def test_a_range_result_from_a_frame_carries_the_txns_revision() -> None:
    decoded = result_from_frame([1, 30, [["range", 2, 1, [["a", b"1", 1, 1, 1, 0]]]]])
    assert decoded.revision == 30
    (ranged,) = decoded.results
    assert isinstance(ranged, RangeResult)
    assert (ranged.revision, ranged.count, ranged.more) == (30, 2, True)
    assert ranged.kvs == (KeyValue("a", b"1", 1, 1, 1, 0),)


def test_a_result_frame_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^a put result without its key-value$"):
        result_from_frame([True, 1, [["put", None, None]]])
    with pytest.raises(ValueError, match=rf"^unknown result op '{'w' * 40}'$"):
        result_from_frame([True, 1, [["w" * 50]]])
    with pytest.raises(ValueError, match=r"^unknown result op '7'$"):
        result_from_frame([True, 1, [[7]]])
