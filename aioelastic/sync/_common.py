"""What the primitives share: argument checks, JSON values, the lease they hold, the watch that
outlives connection errors (:class:`ResumingWatch`), and the revision-ordered queue behind the
lock and the election (etcd's ``waitDeletes``)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import AsyncResource

from .._checks import check_timeout as check_timeout  # the primitives' one validator
from ..errors import (
    CompactedError,
    LeaseExpiredError,
    StoreConnectionError,
    StoreError,
    WriteOutcomeUnknownError,
)
from ..store import (
    Compare,
    EventType,
    KeyValue,
    LeaseKeeper,
    Put,
    PutResult,
    Range,
    RangeResult,
    Store,
    Watch,
    WatchEvent,
)
from ._config import LeaseConfig

log = logging.getLogger("aioelastic.sync")

#: Backoff bounds (seconds) for re-establishing a waiter's watch after a connection error.
_RECONNECT_MIN = 0.05
_RECONNECT_MAX = 1.0

#: How long removing a queue or barrier key may take before it is left to its lease (as
#: ``LeaseKeeper.aclose`` bounds its revoke).
REMOVE_TIMEOUT = 5.0

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

    async def aclose(self) -> None:
        """Revoke a private lease (deleting its keys); a shared one is left alone.

        Callers shield this from cancellation."""
        keeper, private = self.keeper, self._shared is None
        if private:
            self.keeper = None
        if private and keeper is not None:
            await keeper.aclose()


#: Re-reads a waiter's state with a range and returns the revision of that read.
Resync = Callable[[], Awaitable[int]]


class ResumingWatch(AsyncResource):
    """A watch of ``prefix`` that connection errors do not end: what every wait and observer of
    the primitives waits on.

    When the stream (or re-establishing it, or a :meth:`resync` read) fails with
    :class:`~aioelastic.errors.StoreConnectionError`, or the stream ends, it waits with backoff
    (``_RECONNECT_MIN`` doubling up to ``_RECONNECT_MAX`` seconds, a warning logged each time)
    and watches again from where it stopped, for as long as its caller waits: only the caller's
    deadline, cancellation or lease guard, or :meth:`aclose`, ends it. The resume point is the
    revision after the last one fully delivered; a revision whose events were cut in half by the
    break is read again and the events already delivered are skipped, so no event is lost or
    delivered twice. If that history has been compacted meanwhile
    (:class:`~aioelastic.errors.CompactedError`), ``resync`` re-reads the state with a range and
    the watch continues from the revision after that read; :meth:`next` then returns ``None``
    so the caller looks at the state again. Without ``resync`` the ``CompactedError`` is raised.
    Every other error propagates.
    """

    def __init__(self, store: Store, prefix: str, what: str, resync: Resync | None = None) -> None:
        self.store = store
        #: The prefix watched; a caller may change it in ``resync`` (the next stream uses it).
        self.prefix = prefix
        self.what = what
        self._resync = resync
        self._watch: Watch | None = None
        self._next = 0  # the first revision not fully delivered: where a new stream starts
        self._seen_at_next: set[str] = set()  # keys of that revision delivered already
        self._backoff = _RECONNECT_MIN
        self._closed = False
        #: The ``CompactedError`` behind the current :meth:`resync`, if one caused it.
        self.compacted: CompactedError | None = None

    async def aclose(self) -> None:
        self._closed = True
        await self._drop()

    def delivered(self, revision: int, key: str) -> bool:
        """Whether the change of ``key`` at ``revision`` is behind the watch's position."""
        return revision < self._next or (revision == self._next and key in self._seen_at_next)

    def start_after(self, revision: int) -> None:
        """Watch from ``revision + 1`` (the caller has read the state at ``revision``)."""
        self._next = revision + 1
        self._seen_at_next = set()

    async def open(self, start_revision: int | None) -> None:
        """Establish the stream from ``start_revision`` (``None``: from now on), riding out
        connection errors; a compacted ``start_revision`` raises ``CompactedError``."""
        while True:
            watch = self.store.watch(self.prefix, start_revision=start_revision)
            try:
                await watch.start()
            except StoreConnectionError as exc:
                await watch.aclose()
                await self.pause(exc)
                continue
            except BaseException:
                await watch.aclose()
                raise
            self._watch = watch
            self.start_after(watch.start_revision - 1)
            return

    async def resync(self) -> None:
        """Re-read the state (``resync``), riding out connection errors; then watch from the
        revision after that read."""
        assert self._resync is not None, "resync needs a resync function"
        await self._drop()
        while True:
            try:
                revision = await self._resync()
            except StoreConnectionError as exc:
                await self.pause(exc)
                continue
            self.start_after(revision)
            return

    async def pause(self, error: BaseException) -> None:
        """Wait out a connection error before the next attempt (the backoff grows each time)."""
        log.warning("%s: %s; watching again in %.2fs", self.what, error, self._backoff)
        await anyio.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, _RECONNECT_MAX)

    async def next(self) -> WatchEvent | None:
        """The next event not delivered yet; ``None`` after the state was re-read (compacted
        history), to be looked at again. ``StopAsyncIteration`` once :meth:`aclose` was called."""
        while True:
            if self._closed:  # by aclose, perhaps from another task while we waited
                raise StopAsyncIteration
            watch = self._watch
            if watch is None:
                if not await self._reopen():
                    return None
                continue
            try:
                event = await watch.__anext__()
            except StopAsyncIteration:
                if self._closed:
                    raise
                await self._drop()  # ended underneath us: watch again
                await self.pause(StoreConnectionError("the watch stream ended"))
                continue
            except StoreConnectionError as exc:
                await self._drop()
                await self.pause(exc)
                continue
            except CompactedError as exc:  # fell behind the history: read the state again
                await self._drop()
                if self._resync is None:
                    raise
                await self._resync_after(exc)
                return None
            if self.delivered(event.revision, event.kv.key):
                continue  # delivered before the break
            if event.revision > self._next:
                self._next = event.revision
                self._seen_at_next = set()
            self._seen_at_next.add(event.kv.key)
            self._backoff = _RECONNECT_MIN
            return event

    async def _reopen(self) -> bool:
        """A new stream from the resume point: True once it runs, False after a resync."""
        watch = self.store.watch(self.prefix, start_revision=self._next)
        try:
            await watch.start()
        except StoreConnectionError as exc:
            await watch.aclose()
            await self.pause(exc)
            return True
        except CompactedError as exc:
            await watch.aclose()
            if self._resync is None:
                raise
            await self._resync_after(exc)
            return False
        except BaseException:
            await watch.aclose()
            raise
        self._watch = watch
        return True

    async def _resync_after(self, error: CompactedError) -> None:
        log.info("%s: %s; reading the state again", self.what, error)
        self.compacted = error
        try:
            await self.resync()
        finally:
            self.compacted = None

    @property
    def position(self) -> int:
        """The first revision not fully delivered yet (where the next stream starts)."""
        return self._next

    async def _drop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            with anyio.CancelScope(shield=True):
                await watch.aclose()


#: A queue entry's key: ``<name>/<its lease id, hex>_<a number, hex>`` (see :class:`QueueEntry`).
_QUEUE_KEY_RE = re.compile(r"(.+)/([0-9a-f]+)_[0-9a-f]+")


def queue_name_of(kv: KeyValue) -> str | None:
    """The name of the lock or election whose queue ``kv`` is an entry of, or None if it is not
    one: its key has the :class:`QueueEntry` form and it is bound to the lease its key names (a
    lock's entry and an election's look the same: the store cannot tell them apart)."""
    match = _QUEUE_KEY_RE.fullmatch(kv.key)
    if match is None or kv.lease == 0 or int(match.group(2), 16) != kv.lease:
        return None
    return match.group(1)


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
        self._created_with: RangeResult | None = None  # the head read with our put

    @property
    def revision(self) -> int:
        """The entry's create revision: its place in the queue (the fencing token)."""
        assert self.kv is not None
        return self.kv.create_revision

    async def create(self, value: bytes) -> KeyValue:
        """Put our key, and read the head of the queue in the same transaction: the
        :meth:`position` that follows usually needs no read of its own (one round trip for an
        uncontended lock or election, as etcd's ``Mutex``)."""
        try:
            result = await self.store.txn(
                compare=[Compare.mod_revision(self.key) == 0],
                success=[Put(self.key, value, self.lease_id), Range(self.prefix, limit=1)],
            )
        except WriteOutcomeUnknownError:
            # The key is ours alone, so reading it back settles whether the write applied.
            kv = await self.store.get(self.key)
            if kv is None or kv.lease != self.lease_id:
                raise
            self.kv = kv
            return kv
        if not result.succeeded:  # pragma: no cover - the key is unique
            raise RuntimeError(f"queue key {self.key!r} already exists")
        put, head = result
        assert isinstance(put, PutResult)
        assert isinstance(head, RangeResult)
        self.kv, self._created_with = put.kv, head
        return put.kv

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
        # Fast path: alone in the queue, one small read settles it (the one made with our key,
        # right after create).
        snapshot, self._created_with = self._created_with, None
        if snapshot is None:
            snapshot = await self.store.range(self.prefix, limit=1)
        if snapshot.count == 1 and snapshot.kvs[0].key == self.key:
            return None, snapshot.revision
        if snapshot.count > 1:
            snapshot = await self.store.range(self.prefix)
        return self._position(snapshot), snapshot.revision

    async def first_position(self) -> tuple[KeyValue | None, int | None]:
        """:meth:`position`, or ``(None, None)`` if the store could not be reached: then
        :meth:`wait_head` reads it again, riding out the outage while its caller waits."""
        try:
            return await self.position()
        except StoreConnectionError:
            return None, None

    async def wait_head(self, before: KeyValue | None, revision: int | None) -> None:
        """Wait until every entry created before ours has gone (etcd's ``waitDeletes``).

        ``before`` and ``revision`` come from :meth:`position` (``revision=None``: not read
        yet). Only the key just before ours is watched; when it goes the queue is read again.
        Connection errors are ridden out (:class:`ResumingWatch`) while the caller waits: its
        deadline, or its lease guard once the outage outlasts the lease, ends the wait.
        """
        ahead = before

        async def read() -> int:
            nonlocal ahead
            ahead, read_at = await self.position()
            if ahead is not None:
                watch.prefix = ahead.key
            return read_at

        what = f"waiting in {self.prefix!r}"
        watch = ResumingWatch(self.store, self.prefix if before is None else before.key, what, read)
        async with watch:
            if revision is None:
                await watch.resync()
            else:
                watch.start_after(revision)
            while ahead is not None:
                event = await watch.next()
                if event is None:
                    continue  # the queue was read again
                if event.type is EventType.DELETE and event.kv.key == ahead.key:
                    await watch.resync()  # who is before us now (that one may be gone too)

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
        """Delete our key if it is still ours (callers shield this from cancellation).

        Bounded like a lease's revoke: a store that does not answer cannot hold a timed-out or
        cancelled wait in its clean-up."""
        kv, self.kv = self.kv, None
        if kv is None or self.store.closed:
            return
        error: object = f"no answer within {REMOVE_TIMEOUT:g}s"
        with anyio.move_on_after(REMOVE_TIMEOUT):
            try:
                await self.store.compare_and_delete(self.key, kv.mod_revision)
                return
            except StoreError as exc:
                error = exc
        log.warning(
            "could not delete %r (%s); it stays until lease %#x ends",
            self.key,
            error,
            self.lease_id,
        )


async def head_of(store: Store, prefix: str) -> tuple[KeyValue | None, int]:
    """The entry with the lowest create revision under ``prefix``, and the read's revision."""
    snapshot = await store.range(prefix)
    head = min(snapshot.kvs, key=lambda kv: kv.create_revision, default=None)
    return head, snapshot.revision
