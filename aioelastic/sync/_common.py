"""What the primitives share: argument checks, JSON values, the lease they hold, and the
revision-ordered queue behind the lock and the election (etcd's ``waitDeletes``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import socket
from typing import Any

import anyio

from ..errors import (
    CompactedError,
    LeaseExpiredError,
    StoreConnectionError,
    StoreError,
    WriteOutcomeUnknownError,
)
from ..store import EventType, KeyValue, LeaseKeeper, RangeResult, Store
from ._config import LeaseConfig

log = logging.getLogger("aioelastic.sync")

#: Backoff bounds (seconds) for re-establishing a waiter's watch after a connection error.
_RECONNECT_MIN = 0.05
_RECONNECT_MAX = 1.0

#: The largest JSON payload (encoded, bytes) an event, parameter or job state may carry.
MAX_JSON_BYTES = 64 * 1024

JSONValue = Any  # None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]

_entry_numbers = itertools.count(1)


def check_name(name: object, what: str = "name") -> str:
    """A primitive's name: a non-empty str used as a key prefix (``name + "/"``)."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__}")
    if not name or name.endswith("/"):
        raise ValueError(f"{what} must be a non-empty str not ending in '/', got {name!r}")
    return name


def check_timeout(timeout: object, name: str = "timeout") -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"{name} must be >= 0 seconds or None, got {timeout!r}")
    return float(timeout)


def check_config(config: object) -> LeaseConfig:
    if config is None:
        return LeaseConfig()
    if not isinstance(config, LeaseConfig):
        raise TypeError(f"config must be a LeaseConfig, got {type(config).__name__}")
    return config


def default_identity() -> str:
    """``host:pid``, what a holder or leader writes about itself unless told otherwise."""
    return f"{socket.gethostname()}:{os.getpid()}"


def encode_json(value: JSONValue, what: str) -> bytes:
    """``value`` as compact UTF-8 JSON; a clear error if it is not JSON or too big."""
    try:
        data = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable (no NaN/inf): {exc}") from None
    encoded = data.encode()
    if len(encoded) > MAX_JSON_BYTES:
        raise ValueError(f"{what} is {len(encoded)} bytes as JSON; the limit is {MAX_JSON_BYTES}")
    return encoded


def decode_json(data: bytes, what: str) -> JSONValue:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{what} is not valid JSON: {data[:60]!r} ({exc})") from None


class HeldLease:
    """The lease a primitive holds its key with: the caller's, or a private one it grants.

    A private lease (no ``lease=`` given) lives from acquire to release; a shared one belongs to
    the caller and is never revoked here.
    """

    def __init__(self, store: Store, lease: LeaseKeeper | None, config: LeaseConfig) -> None:
        if lease is not None and not isinstance(lease, LeaseKeeper):
            raise TypeError(f"lease must be a LeaseKeeper or None, got {type(lease).__name__}")
        self.store = store
        self.config = config
        self._shared = lease
        self.keeper: LeaseKeeper | None = lease

    @property
    def private(self) -> bool:
        """Whether the lease is granted (and revoked) here rather than the caller's."""
        return self._shared is None

    async def open(self) -> LeaseKeeper:
        if self._shared is not None:
            if self._shared.lost:
                raise self._shared.error  # type: ignore[misc]
            return self._shared
        keeper = self.config.lease(self.store)
        await keeper.start()
        self.keeper = keeper
        return keeper

    async def close(self) -> None:
        """Revoke a private lease (deleting its keys); a shared one is left alone.

        Callers shield this from cancellation."""
        keeper, private = self.keeper, self._shared is None
        if private:
            self.keeper = None
        if private and keeper is not None:
            await keeper.aclose()


class QueueEntry:
    """One place in a queue of keys under ``prefix``, ordered by ``create_revision``.

    The key with the lowest create revision is at the head (holds the lock, leads). A waiter
    watches only the key just before its own and re-reads when that one goes, as etcd's
    ``concurrency`` package does: no thundering herd on release, no polling.
    """

    def __init__(self, store: Store, prefix: str, lease_id: int) -> None:
        self.store = store
        self.prefix = prefix
        self.lease_id = lease_id
        self.key = f"{prefix}{lease_id:x}_{next(_entry_numbers):x}"
        self.kv: KeyValue | None = None

    @property
    def revision(self) -> int:
        """The entry's create revision: its place in the queue (the fencing token)."""
        assert self.kv is not None
        return self.kv.create_revision

    async def create(self, value: bytes) -> KeyValue:
        try:
            result = await self.store.compare_and_swap(self.key, 0, value, lease=self.lease_id)
        except WriteOutcomeUnknownError:
            # The key is ours alone, so reading it back settles whether the write applied.
            kv = await self.store.get(self.key)
            if kv is None or kv.lease != self.lease_id:
                raise
            self.kv = kv
            return kv
        if not result.succeeded or result.kv is None:  # pragma: no cover - the key is unique
            raise RuntimeError(f"queue key {self.key!r} already exists")
        self.kv = result.kv
        return result.kv

    def _position(self, snapshot: RangeResult) -> KeyValue | None:
        """The entry just before ours in ``snapshot`` (None: we are at the head)."""
        mine = self.revision
        before: KeyValue | None = None
        found = False
        for kv in snapshot:
            if kv.key == self.key:
                found = True
            elif kv.create_revision < mine and (
                before is None or kv.create_revision > before.create_revision
            ):
                before = kv
        if not found:
            raise LeaseExpiredError(self.lease_id, f"the queue key {self.key!r} was deleted")
        return before

    async def position(self) -> tuple[KeyValue | None, int]:
        """The entry just before ours (None: we are at the head) and the read's revision."""
        # Fast path: alone in the queue, one small read settles it.
        snapshot = await self.store.range(self.prefix, limit=1)
        if snapshot.count == 1 and snapshot.kvs[0].key == self.key:
            return None, snapshot.revision
        if snapshot.count > 1:
            snapshot = await self.store.range(self.prefix)
        return self._position(snapshot), snapshot.revision

    async def wait_head(self, before: KeyValue | None, revision: int) -> None:
        """Wait until every entry created before ours has gone (etcd's ``waitDeletes``).

        ``before`` and ``revision`` come from :meth:`position`.
        """
        backoff = _RECONNECT_MIN
        while before is not None:
            try:
                async with self.store.watch(before.key, start_revision=revision + 1) as events:
                    async for event in events:
                        if event.type is EventType.DELETE and event.kv.key == before.key:
                            break
                before, revision = await self.position()
                backoff = _RECONNECT_MIN
            except CompactedError:
                before, revision = await self.position()  # history moved on: read again
            except StoreConnectionError as exc:
                # Reads are safe to repeat: reconnect with backoff while the lease lives (the
                # caller's lease guard ends the wait if the outage outlasts the lease).
                log.warning("waiting in %r: %s; reconnecting in %.2fs", self.prefix, exc, backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _RECONNECT_MAX)
                with contextlib.suppress(StoreConnectionError):
                    before, revision = await self.position()

    async def update(self, value: bytes) -> bool:
        """Rewrite our value in place (create revision unchanged); False if the key is gone."""
        assert self.kv is not None
        result = await self.store.compare_and_swap(
            self.key, self.kv.mod_revision, value, lease=self.lease_id
        )
        if result.succeeded and result.kv is not None:
            self.kv = result.kv
        return result.succeeded

    async def remove(self) -> None:
        """Delete our key if it is still ours (callers shield this from cancellation)."""
        kv, self.kv = self.kv, None
        if kv is None or self.store.closed:
            return
        try:
            await self.store.compare_and_delete(self.key, kv.mod_revision)
        except StoreError as exc:
            log.warning(
                "could not delete %r (%s); it stays until lease %#x ends",
                self.key,
                exc,
                self.lease_id,
            )


async def head_of(store: Store, prefix: str) -> tuple[KeyValue | None, int]:
    """The entry with the lowest create revision under ``prefix``, and the read's revision."""
    snapshot = await store.range(prefix)
    head = min(snapshot.kvs, key=lambda kv: kv.create_revision, default=None)
    return head, snapshot.revision
