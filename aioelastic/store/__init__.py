"""The async key-value store protocol (modelled on etcd v3) and its backends.

``open_store(url)`` picks a backend by URL scheme and imports it only when used. Every backend
implements :class:`Store`; the conveniences (``add``, ``wait_for``, ``lease``, ``namespace``) are
written once on top of its core. Transactions (``store.txn``) are spelled with :class:`Compare`
and the operations :class:`Put`, :class:`Get`, :class:`Range`, :class:`Delete` and
:class:`DeletePrefix`.
"""

from __future__ import annotations

from .._public import publish as _publish
from ._base import Store, Watch
from ._keeper import LeaseKeeper, LeaseKeeperStatistics
from ._prefixed import PrefixedStore
from ._stm import StmTxn
from ._txn import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Compare,
    CompareField,
    Delete,
    DeletePrefix,
    DeleteResult,
    Get,
    GetResult,
    OpResult,
    Put,
    PutResult,
    Range,
    Txn,
    TxnOp,
    TxnResult,
)
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
    "MAX_TXN_BYTES",
    "MAX_TXN_OPS",
    "CasResult",
    "Compare",
    "CompareField",
    "Delete",
    "DeletePrefix",
    "DeleteResult",
    "EventType",
    "Get",
    "GetResult",
    "KeyValue",
    "LeaseGrant",
    "LeaseKeeper",
    "LeaseKeeperStatistics",
    "LeaseStatus",
    "MemoryEngine",
    "MemoryStore",
    "OpResult",
    "PrefixedStore",
    "Put",
    "PutResult",
    "Range",
    "RangeResult",
    "StmTxn",
    "Store",
    "StoreOpener",
    "Txn",
    "TxnOp",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "open_store",
    "register_backend",
    "supported_schemes",
]

_publish(globals())
