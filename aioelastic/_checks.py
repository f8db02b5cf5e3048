"""The validators the packages share, and the defaults they guard.

Each user-facing value is checked once, where it enters (a constructor, ``RendezvousParameters``),
by one function here; a bad value's error names the key. A root module, as ``_public`` is, so
that ``store``, ``sync``, ``timer`` and ``rendezvous`` share one copy without importing each
other's private modules.
"""

from __future__ import annotations

import math
import re

from .errors import ConfigError

__all__ = [
    "DEFAULT_LEASE_TTL",
    "ID_PATTERN",
    "RUN_ID_FORM",
    "check_run_id",
    "check_timeout",
    "check_ttl",
]

#: torch's rendezvous lease TTL, ``keep_alive_interval`` (5 s) x ``keep_alive_max_attempt`` (3):
#: how long a dead node's records outlive it (the rendezvous handlers' and ``--rdzv-conf``'s
#: default; ``rendezvous.dynamic.DEFAULTS`` holds the two factors).
DEFAULT_LEASE_TTL = 15.0

#: A run or node id: 1-128 characters of ``A-Z a-z 0-9 _ . : @ -``. Never ``/`` (ids are key
#: segments) nor ``,`` (id lists are comma-joined).
ID_PATTERN = r"[A-Za-z0-9_.:@\-]{1,128}"
_ID_RE = re.compile(ID_PATTERN)
RUN_ID_FORM = "1-128 characters of letters, digits and '_.:@-' (no '/')"


def check_run_id(run_id: object) -> str:
    """A run id (see :data:`ID_PATTERN`), else ``ConfigError('run_id', ...)``."""
    if not isinstance(run_id, str) or not _ID_RE.fullmatch(run_id):
        raise ConfigError("run_id", run_id, RUN_ID_FORM)
    return run_id


def check_ttl(ttl: object, name: str = "ttl") -> float:
    """A finite number of seconds > 0 (a lease's TTL, an interval)."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(ttl).__name__}")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {ttl!r}")
    return float(ttl)


def check_timeout(timeout: object, name: str = "timeout") -> float | None:
    """A number of seconds >= 0, or None (wait forever)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"{name} must be >= 0 seconds or None, got {timeout!r}")
    return float(timeout)
