"""The conveniences of the store protocol, written once on its validated core.

``add``, ``stm``, ``range_and_watch``, ``lease``, ``namespace`` and ``wait_for`` are the same for
every backend: :class:`~aioelastic.store.Store` inherits them from :class:`StoreConveniences`. A
backend may override the underscore-prefixed defaults (``_range_and_watch``; ``_add`` is in the
core) when it can do better, as the http store does in one request.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, TypeVar, cast

import anyio

from .._checks import check_timeout
from ..errors import CompactedError, StoreTimeoutError
from ._args import check_int, check_key, check_prefix
from ._types import EventType, KeyValue, RangeResult

if TYPE_CHECKING:
    from ._base import Store, Watch
    from ._keeper import LeaseKeeper
    from ._stm import StmTxn

__all__ = ["StoreConveniences"]

T = TypeVar("T")


class StoreConveniences:
    """What :class:`~aioelastic.store.Store` builds on its core (mixed into it, nowhere else)."""

    if TYPE_CHECKING:  # the core these are built on (Store defines it)

        def _check_open(self) -> None: ...
        async def _get(self, key: str) -> KeyValue | None: ...
        async def _range(self, prefix: str, limit: int | None) -> RangeResult: ...
        def _watch(self, prefix: str, start_revision: int | None) -> Watch: ...
        async def _add(self, key: str, delta: int) -> int: ...

    def _store(self) -> Store:
        return cast("Store", self)  # only ever mixed into Store

    # -- transactions and counters

    async def stm(
        self,
        fn: Callable[[StmTxn], Awaitable[T]],
        *,
        keys: Iterable[str] = (),
        max_attempts: int = 32,
    ) -> T:
        """Run ``fn(tx)`` as a software transaction (etcd's ``concurrency.NewSTM``) and return
        what it returns.

        ``fn`` reads through ``await tx.get(key)`` (and ``tx.rev(key)``) and stages writes with
        ``tx.put(key, value)`` / ``tx.delete(key)``; they are committed in one transaction if
        no key it read has changed since, else ``fn`` runs again on the new values, at most
        ``max_attempts`` times, then :class:`~aioelastic.errors.TxnConflictError`. ``keys``
        are read together, at one revision, before the first attempt. Commits are
        serializable over the keys read; ``fn`` must have no other effects (it may run more
        than once). See docs/store.md, "Software transactions".
        """
        from ._stm import run_stm

        check_int(max_attempts, "max_attempts", minimum=1)
        if isinstance(keys, str):
            raise TypeError("keys must be a list of keys, not a str")
        self._check_open()
        return await run_stm(self._store(), fn, keys, max_attempts)

    async def add(self, key: str, delta: int = 1) -> int:
        """Atomically add ``delta`` to the decimal integer at ``key`` (absent = 0); return it."""
        check_key(key)
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"delta must be an int, got {type(delta).__name__}")
        self._check_open()
        return await self._add(key, delta)

    # -- reading and following

    async def range_and_watch(self, prefix: str) -> tuple[RangeResult, Watch]:
        """Read every key under ``prefix`` and follow it: the range, and a started watch of every
        change after the range's revision (``start_revision = result.revision + 1``).

        The pattern every waiter on the store follows (read the state, then wait for it to
        change), in one call: on the http backend it is one request (the watch stream opens
        with the range), elsewhere a range and a watch. Close the watch when done (``async
        with watch:``).
        """
        check_prefix(prefix)
        self._check_open()
        return await self._range_and_watch(prefix)

    async def _range_and_watch(self, prefix: str) -> tuple[RangeResult, Watch]:
        while True:
            result = await self._range(prefix, None)
            watch = self._watch(prefix, result.revision + 1)
            try:
                await watch.start()
            except CompactedError:
                # history compacted between the read and the watch (a rare race): read again
                await watch.aclose()
                continue
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await watch.aclose()
                raise
            return result, watch

    # -- leases kept alive, views, waiting for keys

    def lease(self, ttl: float, *, keep_alive_interval: float | None = None) -> LeaseKeeper:
        """A lease kept alive in the background while the ``async with`` block runs.

        Its loss (expiry, revocation, an unreachable store past the TTL) is reported, never
        swallowed: see :class:`~aioelastic.store.LeaseKeeper`.
        """
        from ._keeper import LeaseKeeper

        return LeaseKeeper(self._store(), ttl, keep_alive_interval=keep_alive_interval)

    def namespace(self, prefix: str) -> Store:
        """A view of this store in which every key lives under ``prefix`` (e.g. one run id).

        Keys, ranges, watches and events of the view are relative to ``prefix``. Closing the view
        does not close this store.
        """
        from ._prefixed import PrefixedStore

        return PrefixedStore(self._store(), prefix)

    async def wait_for(
        self, keys: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, KeyValue]:
        """Wait until every key in ``keys`` exists; return their key-values.

        Waits on a watch, not by polling. Raises ``StoreTimeoutError`` naming the missing keys
        if ``timeout`` seconds pass first.
        """
        wanted = [check_key(k, "keys[]") for k in keys]
        timeout = check_timeout(timeout)
        self._check_open()
        found: dict[str, KeyValue] = {}
        if not wanted:
            return found
        missing = set(wanted)
        common = os.path.commonprefix(wanted)  # noqa: RUF071 - a key prefix, not a path
        with anyio.move_on_after(timeout) as scope:
            async with self._watch(common, None) as events:
                for key in wanted:
                    kv = await self._get(key)
                    if kv is not None:
                        found[key] = kv
                        missing.discard(key)
                while missing:
                    event = await events.__anext__()
                    if event.type is EventType.PUT and event.kv.key in missing:
                        found[event.kv.key] = event.kv
                        missing.discard(event.kv.key)
        if scope.cancelled_caught and missing:
            raise StoreTimeoutError(
                f"timed out after {timeout}s waiting for keys {sorted(missing)}"
            )
        return found
