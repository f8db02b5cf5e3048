"""What a waiting rendezvous member holds besides its join's own state, counted (white-box):
with 10,000 members in one process (``python -m benchmarks.scale --mode memory``) each object a
waiting member holds is alive across the round's loop turns, so it is promoted into the oldest
generation and traversed by every full collection. ``next_rendezvous`` holds no error
translator and no bound ``__exit__``/``__aexit__`` while it waits, and every handler made
without an event sink shares one :class:`~aioelastic.events.NullSink`."""

from __future__ import annotations

import asyncio
import gc
import types

import pytest

from aioelastic.errors import RendezvousConnectionError, StoreClosedError
from aioelastic.events import Event, NullSink
from aioelastic.rendezvous import RendezvousStatus
from aioelastic.rendezvous.api import _Translate
from aioelastic.store import MemoryEngine
from aioelastic.testing import run_virtual
from benchmarks.scale import make_handlers

N = 100


def _exit_methods() -> int:
    """Bound ``__exit__``/``__aexit__`` methods alive (a ``with`` block in a suspended frame)."""
    return sum(
        type(o) is types.MethodType and o.__func__.__name__ in ("__exit__", "__aexit__")
        for o in gc.get_objects()
    )


def test_a_waiting_member_holds_no_translator_and_no_bound_exit() -> None:
    async def main() -> tuple[int, int, int, int]:
        handlers = make_handlers(MemoryEngine(), N + 1)[:N]  # min = max = N + 1: all wait
        gc.collect()
        exits_before = _exit_methods()
        joins = [asyncio.ensure_future(h.next_rendezvous()) for h in handlers]
        await asyncio.sleep(1)  # (virtual time: every join registered and waits)
        assert not any(j.done() for j in joins)
        gc.collect()
        translators = sum(type(o) is _Translate for o in gc.get_objects())
        exits = _exit_methods() - exits_before
        sinks = len({id(h.event_sink) for h in handlers})
        nulls = sum(type(o) is NullSink for o in gc.get_objects())
        for join in joins:
            join.cancel()
        await asyncio.gather(*joins, return_exceptions=True)
        await asyncio.gather(*(h.aclose() for h in handlers))
        return translators, exits, sinks, nulls

    translators, exits, sinks, nulls = run_virtual(main)
    assert translators == 0  # (the old code: one per waiting member)
    # the lease guard's bound __exit__ is the one left per member (the old code: three each,
    # with the lock's __aexit__ and the translator's __exit__)
    assert exits <= N, exits
    assert (sinks, nulls) == (1, 1)


class _Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)


def test_a_store_failure_in_a_join_is_translated_reported_and_its_cause_kept() -> None:
    async def main() -> None:
        sink = _Sink()
        (handler,) = make_handlers(MemoryEngine(), 1, event_sink=sink)
        handler._min = 2  # (a round of two: the join waits)
        join = asyncio.ensure_future(handler.next_rendezvous())
        await asyncio.sleep(1)
        await handler.store.aclose()  # its watch of c/ fails: the join with it
        with pytest.raises(RendezvousConnectionError) as failed:
            await join
        assert isinstance(failed.value.__cause__, StoreClosedError)
        assert handler.status is RendezvousStatus.ERROR
        assert handler._error is failed.value
        reported = [e for e in sink.events if e.kind == "rendezvous.join_failed"]
        assert [e.fields["error_type"] for e in reported] == ["RendezvousConnectionError"]
        assert "next_rendezvous failed for run 'scale'" in reported[0].fields["error"]
        assert not handler._lock.locked()  # released on the way out
        await handler.aclose()

    run_virtual(main)
