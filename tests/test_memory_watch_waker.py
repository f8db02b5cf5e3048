"""A memory watch that wakes its reader itself (``_set_waker`` / ``_event_ready`` /
``_take_event``, in-package, as the http store's watch does): a reader that waits on several
things at once (the rendezvous join) takes its events without a task parked in ``__anext__``.
A task, its coroutines, its context and its wake-ups per event are what 10,000 participants in
one process multiply by N, and each full garbage collection walks what is alive of them."""

from __future__ import annotations

import asyncio

import pytest

from aioelastic.errors import CompactedError, StoreClosedError
from aioelastic.store import MemoryEngine, MemoryStore, Watch
from aioelastic.store.memory import _MemoryWatch
from aioelastic.testing import run_virtual


def _mw(watch: Watch) -> _MemoryWatch:
    assert isinstance(watch, _MemoryWatch)
    return watch


def test_a_waker_is_called_once_per_batch_and_the_events_are_taken_in_order() -> None:
    async def main() -> None:
        async with MemoryStore() as store, store.watch("k/") as started:
            watch = _mw(started)
            wakes: list[int] = []
            assert watch._set_waker(lambda: wakes.append(store.engine.revision))
            assert not watch._event_ready()
            assert watch._take_event() is None
            await store.put("k/1", b"a")
            await store.put("other", b"-")  # not under the prefix: no wake-up
            await store.put("k/2", b"b")  # unread already: no second wake-up
            assert wakes == [1]
            assert watch._event_ready()
            taken = [watch._take_event(), watch._take_event()]
            assert [e.kv.key for e in taken if e is not None] == ["k/1", "k/2"]
            assert watch._take_event() is None
            await store.put("k/3", b"c")  # nothing unread again: woken again
            assert wakes == [1, 4]
            event = watch._take_event()
            assert event is not None
            assert event.kv.key == "k/3"

    run_virtual(main)


def test_events_not_taken_stay_for_the_next_reader_in_order() -> None:
    async def main() -> None:
        async with MemoryStore() as store, store.watch("k/") as started:
            watch = _mw(started)
            assert watch._set_waker(lambda: None)
            for i in range(3):
                await store.put(f"k/{i}", b"x")
            first = watch._take_event()
            assert first is not None
            assert first.kv.key == "k/0"
            assert watch._set_waker(None)  # unhooked: the rest is __anext__'s
            rest = [(await watch.__anext__()).kv.key for _ in range(2)]
            assert rest == ["k/1", "k/2"]
            assert store.engine._hub.watchers  # (still registered)
            reader = asyncio.ensure_future(watch.__anext__())
            await asyncio.sleep(0)
            await store.put("k/3", b"x")
            assert (await reader).kv.key == "k/3"

    run_virtual(main)


def test_the_end_of_a_watch_wakes_its_taker_and_is_raised_by_take() -> None:
    async def main() -> None:
        store = MemoryStore(MemoryEngine())
        closed_watch = _mw(store.watch("a/"))
        failed_watch = _mw(store.watch("b/"))
        for watch in (closed_watch, failed_watch):
            await watch.start()
        wakes: list[str] = []
        assert closed_watch._set_waker(lambda: wakes.append("closed"))
        assert failed_watch._set_waker(lambda: wakes.append("failed"))
        await closed_watch.aclose()
        assert wakes == ["closed"]
        assert closed_watch._event_ready()
        with pytest.raises(StopAsyncIteration):
            closed_watch._take_event()
        await store.aclose()  # the store's own watches fail (its engine is shared)
        assert wakes == ["closed", "failed"]
        with pytest.raises(StoreClosedError):
            failed_watch._take_event()

    run_virtual(main)


def test_a_compaction_past_an_unread_event_is_raised_by_take() -> None:
    async def main() -> None:
        engine = MemoryEngine(history_limit=1_000_000)
        store = MemoryStore(engine)
        watch = _mw(store.watch("k/"))
        await watch.start()
        wakes: list[int] = []
        assert watch._set_waker(lambda: wakes.append(engine.revision))
        await store.put("k/1", b"x")
        await store.put("z", b"y")
        await store.compact(engine.revision)  # drops k/1, unread
        assert len(wakes) == 2  # the event, then the failure
        with pytest.raises(CompactedError):
            watch._take_event()
        await store.aclose()

    run_virtual(main)


def test_a_watch_from_the_past_has_its_history_ready_without_a_wake() -> None:
    async def main() -> None:
        async with MemoryStore() as store:
            for i in range(2):
                await store.put(f"k/{i}", b"x")
            async with store.watch("k/", start_revision=1) as started:
                watch = _mw(started)
                assert watch._set_waker(lambda: None)
                assert watch._event_ready()
                keys = [e.kv.key for e in (watch._take_event(), watch._take_event()) if e]
                assert keys == ["k/0", "k/1"]
                assert watch._take_event() is None

    run_virtual(main)


def test_a_watch_not_started_has_no_waker() -> None:
    async def main() -> None:
        async with MemoryStore() as store:
            watch = _mw(store.watch("k/"))
            assert not watch._set_waker(lambda: None)  # (its start is __anext__'s)
            assert watch._set_waker(None)
            await watch.aclose()

    run_virtual(main)
