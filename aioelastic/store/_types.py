"""The records the store protocol speaks in: key-values, events, results and lease states.

They mirror etcd v3's ``mvccpb.KeyValue`` and friends so the etcd backend is a thin mapping.
All are frozen snapshots: cheap to pass around, safe to keep.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CasResult",
    "EventType",
    "KeyValue",
    "LeaseGrant",
    "LeaseStatus",
    "RangeResult",
    "WatchEvent",
]


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key and its value, with the revisions etcd keeps for it.

    ``create_revision``: the revision that created the key (since its last deletion);
    ``mod_revision``: the revision of its last write; ``version``: writes since creation (1 on
    create); ``lease``: the lease the key is attached to, 0 for none.
    In a DELETE event only ``key`` and ``mod_revision`` (the revision of the delete) are set.
    """

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0

    def text(self) -> str:
        """The value decoded as UTF-8."""
        return self.value.decode()


class EventType(enum.Enum):
    """What a watch event reports."""

    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change, as delivered by a watch, in revision order."""

    type: EventType
    kv: KeyValue

    @property
    def revision(self) -> int:
        """The revision at which this change happened."""
        return self.kv.mod_revision


@dataclass(frozen=True, slots=True)
class RangeResult:
    """The answer to a ``range``: the key-values in key order, as of ``revision``.

    ``count`` is the number of keys under the prefix (even beyond ``limit``); ``more`` says
    whether ``limit`` cut the list. A watch from ``revision + 1`` sees every later change.
    """

    kvs: tuple[KeyValue, ...]
    revision: int
    count: int
    more: bool = False

    def __len__(self) -> int:
        return len(self.kvs)

    def __iter__(self) -> Iterator[KeyValue]:
        return iter(self.kvs)

    def __getitem__(self, index: int) -> KeyValue:
        return self.kvs[index]

    def to_dict(self) -> dict[str, bytes]:
        """``{key: value}`` of the returned key-values."""
        return {kv.key: kv.value for kv in self.kvs}


@dataclass(frozen=True, slots=True)
class CasResult:
    """The outcome of a compare-and-swap or compare-and-delete.

    ``succeeded``: whether the write applied. ``revision``: the store revision after the call.
    ``kv``: on success of a swap, the key-value as written; on failure, the key's current
    key-value (``None`` if it is absent); after a successful delete, ``None``.
    """

    succeeded: bool
    revision: int
    kv: KeyValue | None

    def __bool__(self) -> bool:
        return self.succeeded


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """A granted lease: its id and the TTL the store granted (may round the request up)."""

    id: int
    ttl: float


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    """A snapshot of a live lease: granted TTL, time left and the keys attached to it."""

    id: int
    granted_ttl: float
    remaining: float
    keys: tuple[str, ...] = ()
