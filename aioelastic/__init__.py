"""aioelastic: asyncio-native coordination for elastic distributed jobs.

Layering (data flows one way, top to bottom; nothing below ``store`` knows about rendezvous):

    agent          runs and supervises worker processes (``aioelastic run``)
    rendezvous     rounds of membership            timer    watchdog timers
    sync           lock, election, barriers, events, parameters, job state
    store          the async key-value protocol (revisions, compare-and-swap, watches, leases)
    backends       memory (default), http (``aioelastic serve``), etcd (gRPC)

This module is the public facade: it re-exports the names users need. Backends are imported only
when their URL scheme is used.
"""

from __future__ import annotations

from . import errors as _errors
from .errors import *  # noqa: F403  (every error, as errors.__all__ names them)
from .rendezvous import (
    DynamicRendezvousHandler,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousResult,
    RendezvousStatus,
    StaticRendezvousHandler,
    create_handler,
)
from .store import (
    CasResult,
    Compare,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseKeeper,
    LeaseStatus,
    MemoryStore,
    RangeResult,
    Store,
    TxnResult,
    Watch,
    WatchEvent,
    open_store,
)
from .timer import TimerGuard, TimerRequest, expires

__version__ = "0.1.0.dev0"

__all__ = [
    *_errors.__all__,
    "CasResult",
    "Compare",
    "DynamicRendezvousHandler",
    "EventType",
    "KeyValue",
    "LeaseGrant",
    "LeaseKeeper",
    "LeaseStatus",
    "MemoryStore",
    "RangeResult",
    "RendezvousHandler",
    "RendezvousParameters",
    "RendezvousResult",
    "RendezvousStatus",
    "StaticRendezvousHandler",
    "Store",
    "TimerGuard",
    "TimerRequest",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "__version__",
    "create_handler",
    "expires",
    "open_store",
]
