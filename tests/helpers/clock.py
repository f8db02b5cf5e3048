"""An event loop's timer methods on a clock the test moves: for unit tests of a timer's rules
(a deadline at an edge, a re-arm, a cancel) that must not depend on how busy the host is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FakeClock", "FakeTimer"]


class FakeTimer:
    """What ``call_at`` returns: ``when``, and ``cancel()`` as an ``asyncio.TimerHandle`` has."""

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """``time()``, ``call_at()`` and ``call_later()`` of a loop. Nothing fires by itself:
    :meth:`run_until` moves the clock and fires each live timer due by then, in order."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self._timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_at(
        self, when: float, callback: Callable[..., Any], *args: Any, context: Any = None
    ) -> FakeTimer:
        timer = FakeTimer(when, callback, args)
        self._timers.append(timer)
        return timer

    def call_later(
        self, delay: float, callback: Callable[..., Any], *args: Any, context: Any = None
    ) -> FakeTimer:
        return self.call_at(self.now + delay, callback, *args)

    @property
    def pending(self) -> list[float]:
        """When each timer not cancelled nor fired is due, earliest first."""
        return sorted(t.when for t in self._timers if not t.cancelled)

    def fire_next_at(self, now: float) -> None:
        """Fire the earliest live timer at ``now``, before it is due: a loop that wakes a
        timer a little early (asyncio fires what is due within its clock's resolution)."""
        timer = min((t for t in self._timers if not t.cancelled), key=lambda t: t.when)
        self._timers.remove(timer)
        self.now = now
        timer.callback(*timer.args)

    def run_until(self, now: float, max_fired: int = 10_000) -> None:
        """Move to ``now``, firing each live timer due by then (at its own time), in order.

        More than ``max_fired`` timers is an :class:`AssertionError`, not a hang: a timer that
        re-arms itself for a time already reached is a busy loop on a real event loop too."""
        fired = 0
        while due := [t for t in self._timers if not t.cancelled and t.when <= now]:
            if fired == max_fired:
                raise AssertionError(f"over {max_fired} timers fired by {now}: a busy loop")
            timer = min(due, key=lambda t: t.when)
            self._timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback(*timer.args)
            fired += 1
        self.now = now
