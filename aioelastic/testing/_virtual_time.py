"""An asyncio event loop whose clock jumps to the next timer whenever the loop would sleep.

Like trio's ``MockClock(autojump_threshold=0)``: code that waits on ``loop.call_at`` deadlines
(lease expiry, last-call windows, timers, ``asyncio.sleep``, ``anyio.fail_after``) runs as fast
as the CPU allows while ``loop.time()`` advances exactly as if the waits had happened. Real I/O
still works: the loop first checks its selector without blocking and only jumps when nothing is
ready. It is for tests of in-process logic (the memory store); a test that talks to a real
server or process should use a normal loop, since waiting on another process is not "idle".
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar, overload

__all__ = ["VirtualTimeLoop", "run_virtual", "virtual_time_loop"]

T = TypeVar("T")


class _AutoJumpSelector(selectors.BaseSelector):
    """Delegates to a real selector; when a ``select`` would block, advances virtual time."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._inner = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:  # no timer pending: only I/O (or another thread) can wake us
            return self._inner.select(None)
        self._loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop with a virtual clock that auto-jumps when the loop is idle."""

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = float(start)
        super().__init__(_AutoJumpSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (timers that fall due run on the next pass)."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self._virtual_now += seconds


def virtual_time_loop() -> VirtualTimeLoop:
    """A new :class:`VirtualTimeLoop` (a ``loop_factory`` for ``asyncio.Runner``)."""
    return VirtualTimeLoop()


def run_virtual(main: Callable[[], Awaitable[T]] | Coroutine[Any, Any, T]) -> T:
    """Run ``main`` (a coroutine, or a function returning one) to completion in virtual time."""
    with asyncio.Runner(loop_factory=virtual_time_loop) as runner:
        coro = main if isinstance(main, Coroutine) else main()
        return runner.run(_as_coroutine(coro))


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


@overload
def virtual_test(test: Callable[[], Awaitable[None]], /) -> Callable[[], None]: ...


@overload
def virtual_test(
    *, timeout: float = 3600.0
) -> Callable[[Callable[[], Awaitable[None]]], Callable[[], None]]: ...


def virtual_test(
    test: Callable[[], Awaitable[None]] | None = None, /, *, timeout: float = 3600.0
) -> Any:
    """Run an async test body as a plain (sync) test in virtual time, bounded by ``timeout``
    virtual seconds so that a hang fails fast instead of waiting for pytest's timeout.

    ``@virtual_test`` or ``@virtual_test(timeout=60)`` on an ``async def test_...()`` without
    arguments; it works with or without pytest-asyncio (which then leaves the test alone).
    """

    def decorate(body: Callable[[], Awaitable[None]]) -> Callable[[], None]:
        async def bounded() -> None:
            async with asyncio.timeout(timeout):
                await body()

        @functools.wraps(body)
        def run() -> None:
            run_virtual(bounded)

        return run

    return decorate if test is None else decorate(test)
