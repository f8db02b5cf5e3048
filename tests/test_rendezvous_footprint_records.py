"""What a warm dynamic join spends on the records it writes, counted (white-box): each member
writes its registration (and, when nobody drives yet, a driver claim and the word to the last
round's members) every round, and offers a free port for rank 0's collective with it. These
records are formatted directly (``_state``: byte for byte what the JSON encoder writes, without
its Python layer), and the port comes from the C socket, not ``socket.socket``'s wrapper."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from aioelastic.rendezvous import _state
from aioelastic.store import MemoryEngine
from benchmarks.scale import make_handlers

ROUNDS = 5


def _per_warm_join(n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[float, float]:
    """Records encoded through the generic JSON encoder (``_state._dump``) and Python sockets
    created, per warm join of rounds of ``n`` over the memory store."""
    dumps = sockets = 0
    dump = _state._dump

    def counting_dump(obj: dict[str, Any]) -> bytes:
        nonlocal dumps
        dumps += 1
        return dump(obj)

    class CountingSocket(socket.socket):
        def __init__(self, *args: Any, **kw: Any) -> None:
            nonlocal sockets
            sockets += 1
            super().__init__(*args, **kw)

    async def main() -> None:
        nonlocal dumps, sockets
        handlers = make_handlers(MemoryEngine(), n, last_call_timeout=0)
        try:
            for _ in range(3):
                await asyncio.gather(*(h.next_rendezvous() for h in handlers))
            monkeypatch.setattr(_state, "_dump", counting_dump)
            monkeypatch.setattr(socket, "socket", CountingSocket)
            dumps = sockets = 0
            for _ in range(ROUNDS):
                await asyncio.gather(*(h.next_rendezvous() for h in handlers))
            monkeypatch.undo()
        finally:
            await asyncio.gather(*(h.aclose() for h in handlers))

    asyncio.run(main())
    joins = ROUNDS * n
    return dumps / joins, sockets / joins


def test_a_warm_join_of_one_encodes_only_the_drivers_round_records_generically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dumps, sockets = _per_warm_join(1, monkeypatch)
    # the round record and its roster chunk (the old code: the registration, the driver claim
    # and the member record too, 5)
    assert dumps == 2.0, dumps
    assert sockets == 0.0, sockets  # (the old code: one per join, for its free port)


def test_a_warm_members_join_encodes_nothing_generically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dumps, sockets = _per_warm_join(8, monkeypatch)
    # the driver's round record and roster chunk, shared by the 8 (the old code: each member's
    # registration and its share of the claims, words and member records written, 2.5)
    assert dumps <= 0.25, dumps
    assert sockets == 0.0, sockets
