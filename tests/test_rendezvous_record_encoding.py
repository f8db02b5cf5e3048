"""The records a join writes every round are formatted directly (no JSON encoder's Python
layer): byte for byte what the generic encoder writes for the same fields, and decoded back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aioelastic.rendezvous._state import (
    SCHEMA_VERSION,
    DriverRecord,
    DueRecord,
    MemberRecord,
    NodeRecord,
    _dump,
)

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
texts = st.text(max_size=30)  # an address: any text (quotes, backslashes, non-ASCII escaped)
counts = st.integers(min_value=0, max_value=2**40)


@given(ids, texts, st.integers(min_value=0, max_value=65535))
def test_a_node_record_is_what_the_encoder_writes(node_id: str, addr: str, port: int) -> None:
    record = NodeRecord(node_id, addr, port)
    generic = _dump({"v": SCHEMA_VERSION, "kind": "node", "id": node_id, "a": addr, "p": port})
    assert record.encode() == generic
    assert NodeRecord.decode(f"x/n/0/{node_id}", record.encode()) == record


@given(counts, ids)
def test_a_driver_record_is_what_the_encoder_writes(round_: int, node_id: str) -> None:
    record = DriverRecord(round_, node_id)
    generic = _dump({"v": SCHEMA_VERSION, "kind": "driver", "r": round_, "id": node_id})
    assert record.encode() == generic
    assert DriverRecord.decode("x/c/driver", record.encode()) == record


@given(ids, counts, st.booleans())
def test_a_due_record_is_what_the_encoder_writes(node_id: str, waiting: int, restart: bool) -> None:
    record = DueRecord(node_id, waiting, restart)
    generic = _dump(
        {"v": SCHEMA_VERSION, "kind": "due", "id": node_id, "n": waiting, "s": int(restart)}
    )
    assert record.encode() == generic
    assert DueRecord.decode("x/m/0/~due", record.encode()) == record


@given(counts)
def test_a_member_record_is_what_the_encoder_writes(rank: int) -> None:
    record = MemberRecord(rank)
    assert record.encode() == _dump({"v": SCHEMA_VERSION, "kind": "member", "k": rank})
    assert MemberRecord.decode("x/m/0/n", record.encode()) == record


def test_an_address_with_quotes_and_non_ascii_text_is_escaped() -> None:
    value = NodeRecord("n1", 'h"\\é\n', 1).encode()
    assert value == b'{"v":1,"kind":"node","id":"n1","a":"h\\"\\\\\\u00e9\\n","p":1}'
