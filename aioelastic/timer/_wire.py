"""The timer wire record: what a timer request carries between processes, validated on receipt.

Clocks. In-process timers (:mod:`aioelastic.timer.local`) use event-loop time
(``loop.time()``), so a virtual-time loop reaps them without waiting. A timer that crosses a
process boundary travels as a :class:`TimerRequest` whose ``expiration_time`` is wall-clock
(``time.time()``, as torch's), because two processes share no loop clock; the server converts it
to a loop deadline on receipt: ``deadline = loop.time() + (expiration_time - time.time())``.
Across hosts this assumes synchronised wall clocks (NTP): clock skew shifts the reap by as much.
"""

from __future__ import annotations

import json
import math
import signal as _signal
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["ExpiredTimer", "ReapEvent", "TimerRequest", "WorkerId", "wall_clock"]

#: Whatever identifies a worker to its server (a pid, a task, a name).
WorkerId = Hashable

#: Version of the wire format (the ``"v"`` field of a JSON request).
WIRE_VERSION = 1
#: Longest accepted scope id / worker id on the wire, in characters.
MAX_ID_LENGTH = 1024

# -- argument validation -------------------------------------------------------------------------


def check_duration(after: object, name: str = "after") -> float:
    """A finite number of seconds >= 0, else a ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(after, bool) or not isinstance(after, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(after).__name__}")
    if not math.isfinite(after) or after < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {after!r}")
    return float(after)


def check_scope_id(scope_id: object, name: str = "scope_id") -> str:
    if not isinstance(scope_id, str):
        raise TypeError(f"{name} must be a str, got {type(scope_id).__name__}")
    if not scope_id:
        raise ValueError(f"{name} must not be empty")
    if len(scope_id) > MAX_ID_LENGTH:
        raise ValueError(f"{name} is longer than {MAX_ID_LENGTH} characters")
    return scope_id


def check_signal(sig: object, name: str = "signal") -> int:
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise TypeError(f"{name} must be a signal number (int), got {type(sig).__name__}")
    if not 1 <= sig < _signal.NSIG:
        raise ValueError(f"{name} must be a signal number in 1..{_signal.NSIG - 1}, got {sig}")
    return int(sig)


def check_pid(pid: object, name: str = "pid") -> int:
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError(f"{name} must be a process id (int), got {type(pid).__name__}")
    if pid <= 0:
        raise ValueError(f"{name} must be a process id > 0, got {pid}")
    return pid


# -- the wire record -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimerRequest:
    """One timer request as it travels between processes (torch's ``TimerRequest``).

    ``expiration_time`` is wall-clock seconds since the epoch (``time.time()``); ``None`` (or,
    for torch compatibility, a negative number given to :meth:`from_json`) means *release*.
    ``worker_id`` is an ``int`` (a process id) or a ``str``; ``pid`` names the process a
    :class:`~aioelastic.timer.SignalReaper` signals when it is not the worker id itself;
    ``signal`` overrides the reaper's signal for this timer.
    """

    worker_id: int | str
    scope_id: str
    expiration_time: float | None
    pid: int | None = None
    signal: int | None = None

    def __post_init__(self) -> None:
        worker = self.worker_id
        if isinstance(worker, bool) or not isinstance(worker, (int, str)):
            raise TypeError(f"worker_id must be an int or a str, got {type(worker).__name__}")
        if isinstance(worker, str) and not worker:
            raise ValueError("worker_id must not be empty")
        if isinstance(worker, str) and len(worker) > MAX_ID_LENGTH:
            raise ValueError(f"worker_id is longer than {MAX_ID_LENGTH} characters")
        check_scope_id(self.scope_id)
        exp = self.expiration_time
        if exp is not None:
            if isinstance(exp, bool) or not isinstance(exp, (int, float)):
                raise TypeError(
                    f"expiration_time must be seconds since the epoch or None, "
                    f"got {type(exp).__name__}"
                )
            if not math.isfinite(exp) or exp < 0:
                raise ValueError(
                    f"expiration_time must be finite seconds since the epoch, got {exp!r}"
                )
        if self.pid is not None:
            check_pid(self.pid)
        if self.signal is not None:
            check_signal(self.signal)

    @property
    def is_release(self) -> bool:
        """True if this request releases the timer (no expiration)."""
        return self.expiration_time is None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this request (see :meth:`from_json`)."""
        data: dict[str, Any] = {
            "v": WIRE_VERSION,
            "worker": self.worker_id,
            "scope": self.scope_id,
            "expiration": self.expiration_time,
        }
        if self.pid is not None:
            data["pid"] = self.pid
        if self.signal is not None:
            data["signal"] = self.signal
        return data

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON, no newline: ``{"v":1,"worker":..,"scope":..,"expiration":..}``."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_dict(cls, data: object) -> TimerRequest:
        """Validate a decoded JSON object; raise ``ValueError`` saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"a timer request must be a JSON object, got {type(data).__name__}")
        version = data.get("v")
        if version != WIRE_VERSION:
            raise ValueError(f"unsupported timer request version {version!r} (expected 1)")
        unknown = set(data) - {"v", "worker", "scope", "expiration", "pid", "signal", "id"}
        if unknown:
            raise ValueError(f"unknown field(s) in timer request: {sorted(unknown)}")
        for required in ("worker", "scope", "expiration"):
            if required not in data:
                raise ValueError(f"timer request lacks the {required!r} field")
        exp = data["expiration"]
        if isinstance(exp, (int, float)) and not isinstance(exp, bool) and exp < 0:
            exp = None  # torch: a negative expiration means release
        try:
            return cls(data["worker"], data["scope"], exp, data.get("pid"), data.get("signal"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad timer request: {exc}") from None

    @classmethod
    def from_json(cls, raw: bytes | str) -> TimerRequest:
        """Parse and validate one JSON request; raise ``ValueError`` saying what is wrong."""
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"a timer request must be JSON: {exc}") from None
        return cls.from_dict(data)


# -- what reapers receive and what servers record -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExpiredTimer:
    """A timer whose deadline passed, as handed to a reaper.

    ``deadline`` is in the server's event-loop time; ``expiration_time`` is the wall-clock
    expiration the worker asked for when the timer came over a wire (else ``None``).
    """

    worker_id: WorkerId
    scope_id: str
    deadline: float
    expiration_time: float | None = None
    pid: int | None = None
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class ReapEvent:
    """The record of one reap: which timer, when (loop time), and how late after its deadline.

    ``error`` is the reaper's failure, if it raised (the timer still counts as reaped: it is
    never reaped twice).
    """

    timer: ExpiredTimer
    reaped_at: float
    lateness: float
    error: str | None = None


def wall_clock() -> float:
    """The clock of wire expirations: ``time.time()``."""
    return time.time()
