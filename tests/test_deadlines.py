"""The shared timer of many deadlines (``store/_deadlines.py``): the memory engine's lease
expiries and the lease keepers' renewals are entries of a heap on one loop timer each."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from aioelastic.store._deadlines import Deadlines
from aioelastic.testing import run_virtual


def test_items_are_called_at_their_time_in_deadline_then_insertion_order() -> None:
    async def main() -> list[tuple[float, str]]:
        loop = asyncio.get_running_loop()
        called: list[tuple[float, str]] = []
        deadlines: Deadlines[str] = Deadlines(lambda item: called.append((loop.time(), item)))
        t0 = loop.time()
        for when, item in ((3.0, "c"), (1.0, "a"), (3.0, "d"), (2.0, "b"), (0.5, "first")):
            deadlines.add(loop, t0 + when, item)
        assert len(deadlines) == 5
        await asyncio.sleep(5)
        assert len(deadlines) == 0
        return [(round(t - t0, 6), item) for t, item in called]

    assert run_virtual(main) == [(0.5, "first"), (1.0, "a"), (2.0, "b"), (3.0, "c"), (3.0, "d")]


def test_a_cancelled_item_is_not_called_and_the_timer_goes_with_the_last() -> None:
    async def main() -> tuple[list[str], int, int]:
        loop = asyncio.get_running_loop()
        called: list[str] = []
        deadlines: Deadlines[str] = Deadlines(called.append)
        t0 = loop.time()
        tokens = {item: deadlines.add(loop, t0 + 1.0, item) for item in ("a", "b", "c")}
        deadlines.cancel(tokens["b"])
        deadlines.cancel(tokens["b"])  # twice: a no-op
        await asyncio.sleep(2)
        deadlines.cancel(tokens["a"])  # called already: a no-op
        late = deadlines.add(loop, loop.time() + 1.0, "late")
        deadlines.cancel(late)  # the last item: its timer is cancelled too
        pending = sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]
        await asyncio.sleep(2)
        return called, pending, len(deadlines)

    assert run_virtual(main) == (["a", "c"], 0, 0)


def test_an_earlier_item_moves_the_timer_and_stale_entries_are_dropped() -> None:
    async def main() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        called: list[str] = []
        deadlines: Deadlines[str] = Deadlines(called.append)
        t0 = loop.time()
        deadlines.add(loop, t0 + 10.0, "later")
        deadlines.add(loop, t0 + 1.0, "sooner")  # before the timer's: the timer moves
        many = [deadlines.add(loop, t0 + 5.0, f"x{i}") for i in range(200)]
        for token in many[:190]:  # most of the heap stale: rebuilt with the live ones only
            deadlines.cancel(token)
        assert len(deadlines._heap) <= 64  # (stale entries: at most as many as live ones, or 64)
        await asyncio.sleep(1.5)
        assert called == ["sooner"]
        await asyncio.sleep(10)
        return called, len(deadlines)

    called, left = run_virtual(main)
    assert called == ["sooner", *(f"x{i}" for i in range(190, 200)), "later"]
    assert left == 0


def test_an_item_that_raises_is_reported_and_the_others_are_still_called() -> None:
    async def main() -> tuple[list[str], list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        called: list[str] = []

        def due(item: str) -> None:
            called.append(item)
            if item == "bad":
                raise ValueError("boom")

        deadlines: Deadlines[str] = Deadlines(due)
        for item in ("bad", "good"):
            deadlines.add(loop, loop.time() + 1.0, item)
        await asyncio.sleep(2)
        return called, reported

    called, reported = run_virtual(main)
    assert called == ["bad", "good"]
    assert len(reported) == 1
    assert isinstance(reported[0]["exception"], ValueError)
    assert "'bad'" in reported[0]["message"]


def test_an_item_added_by_a_due_item_is_called_at_its_own_time() -> None:
    async def main() -> list[tuple[float, str]]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        called: list[tuple[float, str]] = []

        def due(item: str) -> None:
            called.append((round(loop.time() - t0, 6), item))
            if item == "again":
                deadlines.add(loop, loop.time() + 2.0, "then")

        deadlines: Deadlines[str] = Deadlines(due)
        deadlines.add(loop, t0 + 1.0, "again")
        await asyncio.sleep(5)
        return called

    assert run_virtual(main) == [(1.0, "again"), (3.0, "then")]


def test_items_are_called_in_a_context_of_their_own_not_an_adders() -> None:
    """The shared timer runs in a context of its own: a due item sees none of the context
    variables of whoever added it or another item (nor keeps that context alive while it
    waits), as a timer set with its adder's context would."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def main() -> list[tuple[str, str]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, str]] = []
        deadlines: Deadlines[str] = Deadlines(lambda item: seen.append((item, var.get())))

        def add(item: str, when: float) -> None:
            var.set(f"{item}'s adder")
            deadlines.add(loop, loop.time() + when, item)

        contextvars.copy_context().run(add, "a", 1.0)
        contextvars.copy_context().run(add, "b", 0.5)  # moves the timer: set in b's context
        await asyncio.sleep(2)
        return seen

    assert run_virtual(main) == [("b", "unset"), ("a", "unset")]


def test_the_heap_is_rebuilt_only_past_twice_its_live_items_and_64() -> None:
    """Cancelled entries stay in the heap (skipped when they come up) until they are more than
    half of it and it holds more than 64: it never holds more than max(64, 2 x live) entries, and
    a rebuild (O(n)) comes only after as many cancels as live items, not at every cancel."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        sizes: list[int] = []
        for count, cancels in ((100, 51), (65, 33), (64, 33)):
            deadlines: Deadlines[int] = Deadlines(lambda item: None)
            tokens = [deadlines.add(loop, loop.time() + 1.0 + i, i) for i in range(count)]
            for token in tokens[: cancels - 1]:
                deadlines.cancel(token)
            sizes.append(len(deadlines._heap))
            deadlines.cancel(tokens[cancels - 1])
            sizes.append(len(deadlines._heap))
            deadlines.clear()
        return sizes

    # 100 entries: still 100 with 50 live (not more than half stale), 49 after one more cancel;
    # 65 entries: rebuilt with 32 live; 64 entries: never rebuilt (at most 64)
    assert run_virtual(main) == [100, 49, 65, 32, 64, 64]
