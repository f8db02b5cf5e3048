"""Many deadlines on one event-loop timer: the memory engine's lease expiries, the lease keepers'
renewals.

A ``loop.call_at`` per deadline is a ``TimerHandle`` per item (and a bound method or an arguments
tuple for its callback), alive as long as the item waits: with 10,000 participants in one process,
that many objects more for every full garbage collection to traverse. Here the deadlines are a
heap of ``(when, token)`` pairs, plain tuples of numbers that the collector stops tracking, and a
dict from token to item; one timer is set for the earliest. Cancelling drops the item only (its
pair is skipped when it comes up; the heap is rebuilt when most of it is stale).

Items that fall due at the same loop iteration are called in deadline order, then in the order
they were added, as the loop's own timers are; an item that raises is reported to the loop's
exception handler, as a timer callback's error is, and the others are still called.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Deadlines"]

T = TypeVar("T")

#: the context the shared timer runs in (the items' calls need none of whoever added them)
_CONTEXT = contextvars.Context()


class Deadlines(Generic[T]):
    """Items due at loop times; ``due(item)`` is called for each when its time comes.

    It holds no reference to the loop (the one its timer is set on, given to :meth:`add`), so a
    table of them per loop can be keyed weakly by the loop.
    """

    __slots__ = ("_due", "_heap", "_items", "_last", "_timer", "_timer_at")

    def __init__(self, due: Callable[[T], object]) -> None:
        self._due = due
        self._heap: list[tuple[float, int]] = []
        self._items: dict[int, T] = {}
        self._last = 0  # the last token handed out
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, loop: asyncio.AbstractEventLoop, when: float, item: T) -> int:
        """Call ``due(item)`` at ``loop``'s time ``when``; returns the token that cancels it."""
        self._last = token = self._last + 1
        heapq.heappush(self._heap, (when, token))
        self._items[token] = item
        if self._timer is None or when < self._timer_at:
            self._set_timer(loop, when)
        return token

    def cancel(self, token: int) -> None:
        """Do not call the item of ``token`` (a no-op once it was called or cancelled)."""
        if self._items.pop(token, None) is None:
            return
        if not self._items:
            self.clear()
        elif len(self._heap) > 64 and len(self._heap) > 2 * len(self._items):
            items = self._items
            self._heap = [entry for entry in self._heap if entry[1] in items]
            heapq.heapify(self._heap)

    def clear(self) -> None:
        """Cancel every item and the timer."""
        self._items.clear()
        self._heap.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _set_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._fire, context=_CONTEXT)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        heap, items = self._heap, self._items
        due = []
        while heap and heap[0][0] <= now:
            item = items.pop(heapq.heappop(heap)[1], None)
            if item is not None:
                due.append(item)
        while heap and heap[0][1] not in items:  # (stale: cancelled)
            heapq.heappop(heap)
        if heap and self._timer is None:
            self._set_timer(loop, heap[0][0])
        for item in due:
            try:
                self._due(item)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                what = f"a deadline's callback failed: {self._due!r}({item!r})"
                loop.call_exception_handler({"message": what, "exception": exc})
