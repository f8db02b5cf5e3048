"""What a warm dynamic join spends on the records it writes, counted (white-box): each member
writes its registration (and, when nobody drives yet, a driver claim and the word to the last
round's members) every round. These records are formatted directly (``_state``: byte for byte
what the JSON encoder writes, without its Python layer: 9 us for the four, 23 us before)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aioelastic.rendezvous import _state
from aioelastic.store import MemoryEngine
from benchmarks.scale import make_handlers

ROUNDS = 5


def _per_warm_join(n: int, monkeypatch: pytest.MonkeyPatch) -> float:
    """Records encoded through the generic JSON encoder (``_state._dump``) per warm join of
    rounds of ``n`` over the memory store."""
    dumps = 0
    dump = _state._dump

    def counting_dump(obj: dict[str, Any]) -> bytes:
        nonlocal dumps
        dumps += 1
        return dump(obj)

    async def main() -> None:
        nonlocal dumps
        handlers = make_handlers(MemoryEngine(), n, last_call_timeout=0)
        try:
            for _ in range(3):
                await asyncio.gather(*(h.next_rendezvous() for h in handlers))
            monkeypatch.setattr(_state, "_dump", counting_dump)
            dumps = 0
            for _ in range(ROUNDS):
                await asyncio.gather(*(h.next_rendezvous() for h in handlers))
            monkeypatch.undo()
        finally:
            await asyncio.gather(*(h.aclose() for h in handlers))

    asyncio.run(main())
    return dumps / (ROUNDS * n)


def test_a_warm_join_of_one_encodes_only_the_drivers_round_records_generically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dumps = _per_warm_join(1, monkeypatch)
    # the round record and its roster chunk (the old code: the registration, the driver claim
    # and the member record too, 5)
    assert dumps == 2.0, dumps


def test_a_warm_members_join_encodes_nothing_generically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dumps = _per_warm_join(8, monkeypatch)
    # the driver's round record and roster chunk, shared by the 8 (the old code: each member's
    # registration and its share of the claims, words and member records written, 2.5)
    assert dumps <= 0.25, dumps
