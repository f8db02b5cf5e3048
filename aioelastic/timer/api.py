"""The timer API in one place, for code written against it: each name lives in its own module.

- :mod:`._wire`: the wire record (:class:`TimerRequest`), :class:`ExpiredTimer`,
  :class:`ReapEvent` and the validation of what a request carries;
- :mod:`._client`: the :class:`TimerClient` ABC;
- :mod:`._server`: the :class:`TimerServer` engine (armed timers as ``loop.call_at`` deadlines);
- :mod:`._guard`: :func:`expires`, :class:`TimerGuard` and the process-wide client
  (:func:`configure`, :func:`get_client`).
"""

from __future__ import annotations

from ._client import TimerClient, WorkerId  # noqa: F401
from ._guard import RELEASE_TIMEOUT, TimerGuard, configure, expires, get_client  # noqa: F401
from ._server import Reaper, TimerServer, TimerServerStatistics
from ._wire import (  # noqa: F401
    MAX_ID_LENGTH,
    WIRE_VERSION,
    ExpiredTimer,
    ReapEvent,
    TimerRequest,
    check_duration,
    check_pid,
    check_scope_id,
    check_signal,
    wall_clock,
)

# the public names (the others are importable for code that used them from here)
__all__ = [
    "ExpiredTimer",
    "ReapEvent",
    "Reaper",
    "TimerClient",
    "TimerGuard",
    "TimerRequest",
    "TimerServer",
    "TimerServerStatistics",
    "configure",
    "expires",
    "get_client",
]
