"""The abstract store protocol: a small required core per backend, conveniences written once.

A backend subclasses :class:`Store` and implements the underscore-prefixed core
(``_get``, ``_range``, ``_put``, ``_delete``, ``_compare_and_swap``, ``_compare_and_delete``,
``_txn``, ``_watch``, the ``_lease_*`` calls, ``_current_revision``, ``_compact``,
``_aclose``). The public methods validate arguments (:mod:`._args`) and the closed state once,
here; the conveniences (``add``, ``stm``, ``range_and_watch``, ``wait_for``, ``lease``,
``namespace``) are built on the core once, in :mod:`._conveniences`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Self

from anyio.abc import AsyncResource

from .._checks import check_ttl
from ..errors import StoreClosedError

# (re-exported: the backends and _txn/_stm import the checks from here)
from ._args import check_int as check_int
from ._args import check_key as check_key
from ._args import check_prefix as check_prefix
from ._args import check_value as check_value
from ._args import prefix_end as prefix_end
from ._conveniences import StoreConveniences
from ._types import (
    CasResult,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    RangeResult,
    WatchEvent,
)

if TYPE_CHECKING:
    from ._add import CounterAdder
    from ._txn import Compare, Txn, TxnOp, TxnResult

__all__ = ["Store", "Watch"]

#: Features a backend can declare. The conformance suite skips (never silently passes) the tests
#: of a feature a backend does not declare.
ALL_FEATURES: frozenset[str] = frozenset({"compaction", "fractional_ttl"})


# -- the watch handle ---------------------------------------------------------------------------


class Watch(AsyncResource):
    """An ordered stream of :class:`WatchEvent` for every key under a prefix.

    Use it as ``async with store.watch(prefix) as events: async for event in events: ...``.
    Entering waits until the watch is established on the store, so a change made after
    ``__aenter__`` returns is always seen. Iterating without ``async with`` starts it lazily;
    then call :meth:`aclose` when done. Events come in revision order, each exactly once; the
    iterator raises :class:`~aioelastic.errors.CompactedError` if the start revision (or a lagging
    position) has been compacted, and :class:`~aioelastic.errors.StoreClosedError` when the store
    is closed.
    """

    def __init__(self, prefix: str, start_revision: int | None) -> None:
        self.prefix = prefix
        self.requested_revision = start_revision
        self._started = False
        self._closed = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._closed:
            raise StopAsyncIteration
        if not self._started:
            await self.start()
        return await self._next()

    async def start(self) -> None:
        """Establish the watch (idempotent)."""
        if self._started:
            return
        if self._closed:
            raise StoreClosedError("watch is closed")
        await self._start()
        self._started = True

    async def aclose(self) -> None:
        """Stop the watch and release its resources on the store (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self._aclose()

    def _set_waker(self, wake: Callable[[], None] | None) -> bool:
        """In-package, for a reader that waits on several things at once (the rendezvous join):
        have ``wake`` called (on the loop, synchronously) whenever an event or the watch's end
        becomes ready to take with :meth:`_take_event`, so the reader needs no task parked in
        ``__anext__``. ``None`` unhooks it. False: this watch does not support it (read it with
        ``__anext__``). A started watch's default: not supported."""
        return False

    def _take_event(self) -> WatchEvent | None:
        """The next event without waiting (None: none is ready yet), or what ``__anext__`` would
        raise at the watch's end; only for a watch whose :meth:`_set_waker` returned True."""
        raise NotImplementedError("this watch has no waker (read it with __anext__)")

    def _event_ready(self) -> bool:
        """Whether :meth:`_take_event` would return an event or raise (see :meth:`_set_waker`)."""
        raise NotImplementedError("this watch has no waker (read it with __anext__)")

    @property
    @abc.abstractmethod
    def start_revision(self) -> int:
        """The first revision this watch reports (known once started)."""

    @abc.abstractmethod
    async def _start(self) -> None: ...

    @abc.abstractmethod
    async def _next(self) -> WatchEvent: ...

    @abc.abstractmethod
    async def _aclose(self) -> None: ...


# -- the store ---------------------------------------------------------------------------------


class Store(StoreConveniences, AsyncResource):
    """The async key-value store protocol, modelled on etcd v3.

    Every key-value carries ``create_revision``, ``mod_revision``, ``version`` and ``lease``; the
    store has one global revision that every write increases by one. Keys are non-empty ``str``;
    values are ``bytes``. A store is an async resource: ``async with`` it or call :meth:`aclose`.
    """

    #: Optional features this backend supports (see ``ALL_FEATURES``).
    features: frozenset[str] = ALL_FEATURES

    def __init__(self) -> None:
        self._closed = False
        self._adder: CounterAdder | None = None

    # -- lifecycle

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Close the client: pending watches end with ``StoreClosedError``; later calls raise it.

        Leases granted through this client are not revoked by the call: they end exactly as if
        the process had died, at their TTL, or on http once the session's grace has passed (the
        server revokes a session's leases when its connection ends; see docs/store.md). Revoke
        them first for a clean exit.
        """
        if self._closed:
            return
        self._closed = True
        await self._aclose()

    def _check_open(self) -> None:
        if self._closed:
            self._raise_closed()

    def _raise_closed(self) -> None:
        raise StoreClosedError(f"{type(self).__name__} is closed")

    # The hot calls (get, put, the compares, txn, keep-alive) test their arguments' common
    # case inline and call the checks of ``._args`` only for anything else (which raise the
    # errors, or accept a str or int subclass): one call per request less at every argument.

    # -- reads

    async def get(self, key: str) -> KeyValue | None:
        """The key-value at ``key``, or ``None`` if absent."""
        if type(key) is not str or not key:
            check_key(key)
        if self._closed:
            self._raise_closed()
        return await self._get(key)

    async def range(self, prefix: str, *, limit: int | None = None) -> RangeResult:
        """Every key-value whose key starts with ``prefix``, in key order (``""``: all keys).

        ``limit`` caps how many are returned (``result.more`` then says there were more).
        The result's ``revision`` is the store revision the read saw.
        """
        check_prefix(prefix)
        if limit is not None:
            check_int(limit, "limit", minimum=1)
        self._check_open()
        return await self._range(prefix, limit)

    async def current_revision(self) -> int:
        """The store's current revision (0 before the first write)."""
        self._check_open()
        return await self._current_revision()

    # -- writes

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``value`` at ``key`` (attached to ``lease`` if non-zero); return the revision."""
        if type(key) is not str or not key:
            check_key(key)
        if type(value) is not bytes:
            value = check_value(value)
        if type(lease) is not int or lease < 0:
            check_int(lease, "lease", minimum=0)
        if self._closed:
            self._raise_closed()
        return await self._put(key, value, lease)

    async def delete(self, key: str) -> int:
        """Delete ``key``; return how many keys were deleted (0 or 1)."""
        check_key(key)
        self._check_open()
        return await self._delete(key, False)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix`` in one revision; return the count."""
        check_prefix(prefix)
        self._check_open()
        return await self._delete(prefix, True)

    async def compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, *, lease: int = 0
    ) -> CasResult:
        """Write ``value`` only if ``key``'s ``mod_revision`` is ``expected_mod_revision``.

        ``expected_mod_revision=0`` means "only if the key is absent". On failure the result
        carries the key's current key-value (``None`` if absent) so the caller need not re-read.
        """
        if type(key) is not str or not key:
            check_key(key)
        if type(expected_mod_revision) is not int or expected_mod_revision < 0:
            check_int(expected_mod_revision, "expected_mod_revision", minimum=0)
        if type(value) is not bytes:
            value = check_value(value)
        if type(lease) is not int or lease < 0:
            check_int(lease, "lease", minimum=0)
        if self._closed:
            self._raise_closed()
        return await self._compare_and_swap(key, expected_mod_revision, value, lease)

    async def compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        """Delete ``key`` only if its ``mod_revision`` is ``expected_mod_revision``."""
        if type(key) is not str or not key:
            check_key(key)
        if type(expected_mod_revision) is not int or expected_mod_revision < 1:
            check_int(expected_mod_revision, "expected_mod_revision", minimum=1)
        if self._closed:
            self._raise_closed()
        return await self._compare_and_delete(key, expected_mod_revision)

    async def txn(
        self,
        *,
        compare: Iterable[Compare] = (),
        success: Iterable[TxnOp] = (),
        failure: Iterable[TxnOp] = (),
    ) -> TxnResult:
        """An atomic transaction, as etcd's ``Txn``: if every compare holds (none: true), apply
        the ``success`` operations, else the ``failure`` ones, all at one revision.

        Compares see the store before the transaction; each operation sees the ones before it
        (a :class:`~aioelastic.store.Get` after a :class:`~aioelastic.store.Put` of its key
        reads the new value). Watchers see the transaction's events at one revision, in order.
        A branch may write a key at most once (no put twice, no put of a key it deletes); at
        most 128 compares and 128 operations per branch, and 1 MiB of keys and values, else
        :class:`~aioelastic.errors.TxnTooLargeError`. A put with a lease that does not exist
        fails the whole transaction with ``LeaseNotFoundError`` (nothing is applied).
        """
        checked = _check_txn(compare, success, failure)
        if self._closed:
            self._raise_closed()
        return await self._txn(checked)

    # -- watches

    def watch(self, prefix: str, *, start_revision: int | None = None) -> Watch:
        """Watch every key under ``prefix`` from ``start_revision`` (default: changes from now on).

        See :class:`Watch`. Resume an interrupted watch from the last event's revision + 1.
        """
        check_prefix(prefix)
        if start_revision is not None:
            check_int(start_revision, "start_revision", minimum=1)
        self._check_open()
        return self._watch(prefix, start_revision)

    async def compact(self, revision: int) -> None:
        """Discard history before ``revision``: watches can no longer start below it."""
        check_int(revision, "revision", minimum=1)
        self._check_open()
        await self._compact(revision)

    # -- leases

    async def lease_grant(self, ttl: float) -> LeaseGrant:
        """Grant a lease that expires ``ttl`` seconds from now unless kept alive.

        Keys put with ``lease=grant.id`` are deleted when it expires or is revoked. The granted TTL
        may be longer than asked (etcd grants whole seconds).
        """
        ttl = check_ttl(ttl)
        self._check_open()
        return await self._lease_grant(ttl)

    async def lease_keep_alive(self, lease_id: int) -> float:
        """Restart the lease's TTL; return it. Raises ``LeaseNotFoundError`` if it is gone."""
        if type(lease_id) is not int or lease_id < 1:
            check_int(lease_id, "lease_id", minimum=1)
        if self._closed:
            self._raise_closed()
        return await self._lease_keep_alive(lease_id)

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke the lease now, deleting its keys. Raises ``LeaseNotFoundError`` if it is gone."""
        check_int(lease_id, "lease_id", minimum=1)
        self._check_open()
        await self._lease_revoke(lease_id)

    async def lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        """The lease's granted TTL, time left and keys. Raises ``LeaseNotFoundError`` if gone."""
        check_int(lease_id, "lease_id", minimum=1)
        self._check_open()
        return await self._lease_time_to_live(lease_id)

    # -- the required core

    async def _add(self, key: str, delta: int) -> int:
        """``add`` on transactions (see ``_add.py``); a backend with an atomic increment
        overrides this."""
        adder = getattr(self, "_adder", None)  # (a subclass may skip Store.__init__)
        if adder is None:
            from ._add import CounterAdder

            adder = self._adder = CounterAdder(self)
        return await adder.add(key, delta)

    @abc.abstractmethod
    async def _get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def _range(self, prefix: str, limit: int | None) -> RangeResult: ...

    @abc.abstractmethod
    async def _current_revision(self) -> int: ...

    @abc.abstractmethod
    async def _put(self, key: str, value: bytes, lease: int) -> int: ...

    @abc.abstractmethod
    async def _delete(self, key: str, prefix: bool) -> int: ...

    @abc.abstractmethod
    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult: ...

    @abc.abstractmethod
    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult: ...

    @abc.abstractmethod
    async def _txn(self, txn: Txn) -> TxnResult: ...

    @abc.abstractmethod
    def _watch(self, prefix: str, start_revision: int | None) -> Watch: ...

    @abc.abstractmethod
    async def _compact(self, revision: int) -> None: ...

    @abc.abstractmethod
    async def _lease_grant(self, ttl: float) -> LeaseGrant: ...

    @abc.abstractmethod
    async def _lease_keep_alive(self, lease_id: int) -> float: ...

    @abc.abstractmethod
    async def _lease_revoke(self, lease_id: int) -> None: ...

    @abc.abstractmethod
    async def _lease_time_to_live(self, lease_id: int) -> LeaseStatus: ...

    @abc.abstractmethod
    async def _aclose(self) -> None: ...


def _check_txn(
    compare: Iterable[Compare], success: Iterable[TxnOp], failure: Iterable[TxnOp]
) -> Txn:
    """``._txn.check_txn``, imported on the first transaction (``._txn`` imports this module),
    then bound here in its place: no import statement per call."""
    global _check_txn  # (the lazy import, once)
    from ._txn import check_txn

    _check_txn = check_txn
    return check_txn(compare, success, failure)


def _parse_counter(key: str, value: bytes) -> int:
    try:
        return int(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(
            f"add: the value at {key!r} is not a decimal integer: {value[:40]!r}"
        ) from None
