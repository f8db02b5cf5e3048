"""What a warm dynamic join costs the loop over the http store, counted (white-box): the
torchrun adapter's layout (one process per participant, `benchmarks/rdzv_processes.py`) runs
its joins over http, and every loop turn there is a wake-up of the process.

The http store's watch wakes the join itself when an event arrives (``Watch._set_waker``): the
join takes its control events from the watch's buffer, with no reader task created, stepped and
woken per event, and no loop turn spent letting such a task look at the buffer.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import Any

import pytest

from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousParameters, create_handler
from aioelastic.store.http import HttpStore
from aioelastic.testing.http import ServerThread

BATCHES, JOINS = 5, 10


def _per_warm_join(url: str) -> tuple[float, float]:
    """Callbacks scheduled on the loop (``call_soon``) and tasks created per warm join of a
    round of one over the http store at ``url`` (a server in another thread): the least over
    a few batches of joins (a lease keep-alive or a progress frame that falls in a batch on a
    loaded host adds its own)."""

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        params = RendezvousParameters(
            "c10d", "", uuid.uuid4().hex[:8], 1, 1, store_url=url, last_call_timeout=0
        )
        handler = await create_handler(params)
        assert isinstance(handler, DynamicRendezvousHandler)
        callbacks = tasks = 0
        call_soon = loop.call_soon

        def counting(*args: Any, **kw: Any) -> asyncio.Handle:
            nonlocal callbacks
            callbacks += 1
            return call_soon(*args, **kw)

        def factory(
            loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
        ) -> asyncio.Task[Any]:
            nonlocal tasks
            tasks += 1
            return asyncio.Task(coro, loop=loop, **kw)

        batches = []
        try:
            for _ in range(3):
                await handler.next_rendezvous()
            loop.call_soon = counting  # type: ignore[method-assign,assignment]
            loop.set_task_factory(factory)  # type: ignore[arg-type]
            try:
                for _ in range(BATCHES):
                    callbacks = tasks = 0
                    for _ in range(JOINS):
                        await handler.next_rendezvous()
                    batches.append((callbacks / JOINS, tasks / JOINS))
            finally:
                del loop.call_soon
                loop.set_task_factory(None)
        finally:
            await handler.aclose()
        return min(b[0] for b in batches), min(b[1] for b in batches)

    return asyncio.run(main())


def test_a_warm_http_join_takes_its_control_events_without_a_reader_task(
    http_server: ServerThread,
) -> None:
    callbacks, tasks = _per_warm_join(http_server.url)
    # the driver's task only (the old code: a reader task per control event, 3 in all)
    assert tasks == 1.0, tasks
    # the two answers, the driver's start and the round record's event: 4 (the old code: 10,
    # with a reader task's creation, step and wake-up of the join per event and a turn for it
    # to look at the watch's buffer)
    assert callbacks <= 4.5, callbacks


def test_a_session_watch_wakes_its_taker_and_hands_over_its_events_in_order(
    http_server: ServerThread,
) -> None:
    """The contract the join relies on: the waker is called as events arrive, ``_take_event``
    returns them in order without waiting (None when none is ready), and the watch's end is
    raised as ``__anext__`` would."""

    async def main() -> None:
        async with HttpStore(http_server.url) as store:
            prefix = f"w-{uuid.uuid4().hex[:8]}/"
            watch = store.watch(prefix)
            assert not watch._set_waker(lambda: None)  # not started: read it with __anext__
            await watch.start()
            woken = asyncio.Event()
            assert watch._set_waker(woken.set)
            assert not watch._event_ready()
            assert watch._take_event() is None
            for i in range(3):
                await store.put(f"{prefix}{i}", b"v")
            keys: list[str] = []
            while len(keys) < 3:  # (events arrive in messages: maybe not all in one)
                await asyncio.wait_for(woken.wait(), 10)
                woken.clear()
                while (event := watch._take_event()) is not None:
                    keys.append(event.kv.key)
            assert keys == [f"{prefix}{i}" for i in range(3)]
            woken.clear()
            await watch.aclose()
            assert woken.is_set()  # its end wakes the taker too
            assert watch._event_ready()
            with pytest.raises(StopAsyncIteration):
                watch._take_event()

    asyncio.run(main())
