"""The torchrun adapter's loop thread (``aioelastic.torchrun._LoopThread``): ``run(coro)`` blocks
the caller until the coroutine completes on the loop thread, and costs the loop as little as it
can, since torch's agent pays it per call (``next_rendezvous()``, each store call of the round's
``TorchStore``). Skipped when torch is not installed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import threading
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (optional)"
)


@pytest.fixture
def loop_thread(monkeypatch: pytest.MonkeyPatch) -> Any:
    import aioelastic.torchrun as torchrun

    # asyncio's loop (uvloop's cannot have its call_soon counted)
    monkeypatch.setattr(torchrun, "_new_loop", asyncio.new_event_loop)
    thread = torchrun._LoopThread()
    yield thread
    thread.close()


def test_a_call_costs_the_loop_one_callback_after_its_wake_up(loop_thread: Any) -> None:
    """The wake-up (``call_soon_threadsafe``) starts the task, whose own last step releases the
    caller: one ``call_soon`` (the task's step) per call. ``run_coroutine_threadsafe`` took two:
    the step and the done-callback that copied the task's outcome to the caller's future, a
    loop turn later."""
    loop = loop_thread.loop
    count = 0
    call_soon = loop.call_soon

    def counting(*args: Any, **kw: Any) -> asyncio.Handle:
        nonlocal count
        count += 1
        handle: asyncio.Handle = call_soon(*args, **kw)
        return handle

    async def value() -> int:
        return 7

    async def install() -> None:
        loop.call_soon = counting

    loop_thread.run(install())
    count = 0
    for _ in range(50):
        assert loop_thread.run(value()) == 7
    assert count / 50 == 1.0, count / 50


def test_run_returns_or_raises_the_coroutines_outcome(loop_thread: Any) -> None:
    async def fails() -> None:
        raise KeyError("gone")

    async def cancelled() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    async def where() -> threading.Thread:
        return threading.current_thread()

    assert loop_thread.run(where()) is not threading.current_thread()
    with pytest.raises(KeyError, match="gone"):
        loop_thread.run(fails())
    # as a cancelled future's result() raises (run_coroutine_threadsafe's)
    with pytest.raises(concurrent.futures.CancelledError):
        loop_thread.run(cancelled())


def test_a_call_that_times_out_is_cancelled_on_the_loop(loop_thread: Any) -> None:
    ended = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()

    with pytest.raises(TimeoutError, match=r"no answer within 0\.05 s"):
        loop_thread.run(forever(), 0.05)
    assert ended.wait(10)  # the coroutine was cancelled, not left running
    assert loop_thread.run(asyncio.sleep(0, "still serving"), 10) == "still serving"
