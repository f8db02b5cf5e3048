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

from .errors import (
    AioelasticError,
    CompactedError,
    ConfigError,
    JobStateError,
    LeaseError,
    LeaseExpiredError,
    LeaseNotFoundError,
    NotLeaderError,
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
    SyncError,
    SyncTimeoutError,
    TimeoutException,
    TimerError,
    TimerExpiredError,
    TxnConflictError,
    TxnTooLargeError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
)
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
    "AioelasticError",
    "CasResult",
    "CompactedError",
    "Compare",
    "ConfigError",
    "DynamicRendezvousHandler",
    "EventType",
    "JobStateError",
    "KeyValue",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseGrant",
    "LeaseKeeper",
    "LeaseNotFoundError",
    "LeaseStatus",
    "MemoryStore",
    "NotLeaderError",
    "RangeResult",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousParameters",
    "RendezvousResult",
    "RendezvousStateError",
    "RendezvousStatus",
    "RendezvousTimeoutError",
    "StaticRendezvousHandler",
    "Store",
    "StoreAuthError",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "StoreTimeoutError",
    "SyncError",
    "SyncTimeoutError",
    "TimeoutException",
    "TimerError",
    "TimerExpiredError",
    "TimerGuard",
    "TimerRequest",
    "TxnConflictError",
    "TxnResult",
    "TxnTooLargeError",
    "ValueTooLargeError",
    "Watch",
    "WatchEvent",
    "WriteOutcomeUnknownError",
    "WriteTimeoutError",
    "__version__",
    "create_handler",
    "expires",
    "open_store",
]
