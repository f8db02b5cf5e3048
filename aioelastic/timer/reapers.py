"""Reapers: what a timer server does to a worker whose timer expired.

A reaper is any callable taking an :class:`~aioelastic.timer.ExpiredTimer` (it may return an
awaitable, which the server awaits in its own task). Provided here: :class:`CancelTaskReaper`
(in-process: cancel the worker's asyncio task), :class:`SignalReaper` (send a signal to the
worker's process, SIGKILL by default) and :class:`CallbackReaper` (call a function).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal as _signal
from collections.abc import Callable, Iterable

from ..errors import TimerError
from ._wire import ExpiredTimer, check_pid, check_signal

__all__ = ["CallbackReaper", "CancelTaskReaper", "SignalReaper"]

log = logging.getLogger("aioelastic.timer")


class CancelTaskReaper:
    """Cancel the worker's asyncio task (the worker id of an in-process timer is its task)."""

    def __call__(self, timer: ExpiredTimer) -> None:
        task = timer.worker_id
        if not isinstance(task, asyncio.Task):
            raise TimerError(
                f"CancelTaskReaper needs an asyncio.Task as the worker id, got {task!r}"
            )
        task.cancel(f"watchdog timer of scope {timer.scope_id!r} expired")

    def __repr__(self) -> str:
        return "CancelTaskReaper()"


class SignalReaper:
    """Send ``signal`` (default SIGKILL) to the worker's process.

    The process is the timer's ``pid``, else its worker id when that is an ``int``. A timer may
    carry its own signal. The reaper refuses (raises :class:`~aioelastic.errors.TimerError`,
    which the server logs) to signal this process, its parent (the agent that runs the server)
    and any pid in ``protect`` — unlike torch's FileTimerServer, reaping never kills the server
    or its agent. A process that is already gone counts as reaped.
    """

    def __init__(self, signal: int = _signal.SIGKILL, *, protect: Iterable[int] = ()) -> None:
        self.signal = check_signal(signal)
        self.protect = frozenset(check_pid(pid, "protect[]") for pid in protect)

    def __repr__(self) -> str:
        return f"SignalReaper({_signal.Signals(self.signal).name})"

    def protected(self) -> frozenset[int]:
        """The pids this reaper never signals: this process, its parent and ``protect``."""
        # Not mutated (scripts/mutants): a mutant here signals the test runner itself.
        return self.protect | {os.getpid(), os.getppid()}  # pragma: no mutate

    def __call__(self, timer: ExpiredTimer) -> None:
        pid = timer.pid
        if pid is None:
            worker = timer.worker_id
            if isinstance(worker, int) and not isinstance(worker, bool):
                pid = worker
        if pid is None or pid <= 0:  # pragma: no mutate (pid 0 would signal the process group)
            raise TimerError(
                f"SignalReaper cannot reap worker {timer.worker_id!r}: it has no process id > 0"
            )
        if pid in self.protected():  # pragma: no mutate
            raise TimerError(
                f"SignalReaper refuses to signal pid {pid} (worker {timer.worker_id!r}): it is "
                f"the timer server's own process, its parent or protected"
            )
        sig = timer.signal if timer.signal is not None else self.signal
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            log.info("worker pid %d (scope %r) had already exited", pid, timer.scope_id)


class CallbackReaper:
    """Call ``callback(timer)``; a coroutine function is awaited in the server's task.

    Any callable is a reaper already; this class names the intent and gives a readable repr.
    """

    def __init__(self, callback: Callable[[ExpiredTimer], object]) -> None:
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self.callback = callback

    def __call__(self, timer: ExpiredTimer) -> object:
        return self.callback(timer)

    def __repr__(self) -> str:
        return f"CallbackReaper({self.callback!r})"
