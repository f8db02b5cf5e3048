"""The async key-value store protocol (modelled on etcd v3) and its backends.

``open_store(url)`` picks a backend by URL scheme and imports it only when used. Every backend
implements :class:`Store`; the conveniences (``add``, ``wait_for``, ``lease``, ``namespace``) are
written once on top of its core.
"""

from __future__ import annotations

from .._public import publish as _publish
from ._base import Store, Watch
from ._keeper import LeaseKeeper, LeaseKeeperStatistics
from ._prefixed import PrefixedStore
from ._types import (
    CasResult,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    RangeResult,
    WatchEvent,
)
from ._url import StoreOpener, open_store, register_backend, supported_schemes
from .memory import MemoryEngine, MemoryStore

__all__ = [
    "CasResult",
    "EventType",
    "KeyValue",
    "LeaseGrant",
    "LeaseKeeper",
    "LeaseKeeperStatistics",
    "LeaseStatus",
    "MemoryEngine",
    "MemoryStore",
    "PrefixedStore",
    "RangeResult",
    "Store",
    "StoreOpener",
    "Watch",
    "WatchEvent",
    "open_store",
    "register_backend",
    "supported_schemes",
]

_publish(globals())
