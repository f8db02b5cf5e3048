"""aioelastic: asyncio-native coordination for elastic distributed jobs.

Layering (data flows one way, top to bottom; nothing below ``store`` knows about rendezvous):

    agent          runs and supervises worker processes (``aioelastic run``)
    rendezvous     rounds of membership            timer    watchdog timers
    store          the async key-value protocol (revisions, compare-and-swap, watches, leases)
    backends       memory (default), http (``aioelastic serve``), etcd (gRPC)

This module is the public facade: it re-exports the names users need. Backends are imported only
when their URL scheme is used.
"""

from __future__ import annotations

from .errors import (
    AioelasticError,
    CompactedError,
    ConfigError,
    LeaseError,
    LeaseExpiredError,
    LeaseNotFoundError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    TimeoutException,
    TimerError,
    TimerExpiredError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
)
from .store import (
    CasResult,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseKeeper,
    LeaseStatus,
    MemoryStore,
    RangeResult,
    Store,
    Watch,
    WatchEvent,
    open_store,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "AioelasticError",
    "CasResult",
    "CompactedError",
    "ConfigError",
    "EventType",
    "KeyValue",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseGrant",
    "LeaseKeeper",
    "LeaseNotFoundError",
    "LeaseStatus",
    "MemoryStore",
    "RangeResult",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "Store",
    "StoreAuthError",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "StoreTimeoutError",
    "TimeoutException",
    "TimerError",
    "TimerExpiredError",
    "ValueTooLargeError",
    "Watch",
    "WatchEvent",
    "WriteOutcomeUnknownError",
    "WriteTimeoutError",
    "__version__",
    "open_store",
]
