"""Watchdog timers: a worker arms a timer around a scope of work; a server reaps it if it overruns.

Deadlines are scheduled on the event loop (``loop.call_at``) and each expired timer is reaped
exactly once. Transports: in-process (:mod:`.local`), across processes on one host over a Unix
socket (:mod:`.unix`), across hosts through any store backend (:mod:`.store`). See
``docs/timers.md``.
"""

from __future__ import annotations

from .._public import publish as _publish
from ._client import TimerClient
from ._guard import TimerGuard, configure, expires, get_client
from ._server import Reaper, TimerServer, TimerServerStatistics
from ._wire import ExpiredTimer, ReapEvent, TimerRequest
from .local import LocalTimerClient, LocalTimerServer
from .reapers import CallbackReaper, CancelTaskReaper, SignalReaper
from .store import StoreTimerClient, StoreTimerServer, run_prefix, timer_key
from .unix import BlockingUnixTimerClient, UnixTimerClient, UnixTimerServer

__all__ = [
    "BlockingUnixTimerClient",
    "CallbackReaper",
    "CancelTaskReaper",
    "ExpiredTimer",
    "LocalTimerClient",
    "LocalTimerServer",
    "ReapEvent",
    "Reaper",
    "SignalReaper",
    "StoreTimerClient",
    "StoreTimerServer",
    "TimerClient",
    "TimerGuard",
    "TimerRequest",
    "TimerServer",
    "TimerServerStatistics",
    "UnixTimerClient",
    "UnixTimerServer",
    "configure",
    "expires",
    "get_client",
    "run_prefix",
    "timer_key",
]

_publish(globals())
