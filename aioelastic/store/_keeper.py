"""LeaseKeeper: a lease kept alive in the background, whose loss is reported, never swallowed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

import anyio
from anyio.abc import AsyncResource

from .._checks import check_ttl
from ..errors import (
    LeaseExpiredError,
    LeaseNotFoundError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
)

if TYPE_CHECKING:
    from ._base import Store

__all__ = ["LeaseKeeper", "LeaseKeeperStatistics"]

log = logging.getLogger("aioelastic.store")

#: How long ``aclose`` waits for the revoke of a kept lease before leaving it to expire.
REVOKE_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class LeaseKeeperStatistics:
    """A snapshot of a :class:`LeaseKeeper`: ``last_renewal`` is in event-loop time."""

    lease_id: int
    ttl: float
    renewals: int
    failed_renewals: int
    last_renewal: float
    lost: bool


class LeaseKeeper(AsyncResource):
    """Grant a lease and keep it alive every ``keep_alive_interval`` (default: TTL / 3).

    ``async with store.lease(ttl=5) as lease:`` grants it (``lease.id``) and renews it in a
    background task until the block exits, then revokes it. If the lease is lost — it expired,
    was revoked, or the store stayed unreachable until the TTL ran out — :attr:`lost` becomes
    true, :meth:`wait_lost` returns, the callbacks from :meth:`on_lost` run, and every
    :meth:`guard` scope is cancelled and raises :class:`~aioelastic.errors.LeaseExpiredError`.

    Connection errors are retried until the TTL since the last renewal has passed: a store that
    comes back in time costs nothing. With ``renew_deadline`` (shorter than the TTL), the keeper
    gives up earlier: once ``renew_deadline`` seconds pass without a successful renewal (failed or
    still hanging), the lease counts as lost although the store may keep it until the TTL, so the
    holder stops before anyone else can take over (Kubernetes leader election's rule).

    The background task is a plain asyncio task owned by this object, so a keeper can be entered
    and closed in different tasks (e.g. a pytest-asyncio fixture).
    """

    def __init__(
        self,
        store: Store,
        ttl: float,
        *,
        keep_alive_interval: float | None = None,
        renew_deadline: float | None = None,
    ) -> None:
        self._store = store
        self._requested_ttl = check_ttl(ttl)
        if keep_alive_interval is not None:
            keep_alive_interval = check_ttl(keep_alive_interval, "keep_alive_interval")
            if keep_alive_interval >= self._requested_ttl:
                raise ValueError(
                    f"keep_alive_interval ({keep_alive_interval}s) must be shorter than the "
                    f"ttl ({self._requested_ttl}s)"
                )
        if renew_deadline is not None:
            renew_deadline = check_ttl(renew_deadline, "renew_deadline")
            if renew_deadline >= self._requested_ttl:
                raise ValueError(
                    f"renew_deadline ({renew_deadline}s) must be shorter than the "
                    f"ttl ({self._requested_ttl}s)"
                )
            if keep_alive_interval is not None and renew_deadline <= keep_alive_interval:
                raise ValueError(
                    f"renew_deadline ({renew_deadline}s) must be longer than the "
                    f"keep_alive_interval ({keep_alive_interval}s)"
                )
        self._interval = keep_alive_interval
        self._renew_deadline = renew_deadline
        self._id = 0
        self.ttl = self._requested_ttl
        self._task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self._error: LeaseExpiredError | None = None
        self._callbacks: list[Callable[[LeaseExpiredError], object]] = []
        self._scopes: set[anyio.CancelScope] = set()
        self._renewals = 0
        self._failures = 0
        self._last_renewal = 0.0
        self._closed = False

    # -- lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def start(self) -> None:
        """Grant the lease and start renewing it."""
        if self._task is not None:
            raise RuntimeError("the lease keeper has already started")
        grant = await self._store.lease_grant(self._requested_ttl)
        self._id = grant.id
        self.ttl = grant.ttl
        loop = asyncio.get_running_loop()
        self._last_renewal = loop.time()
        self._task = loop.create_task(self._run(), name=f"aioelastic-lease-{grant.id:x}")

    async def aclose(self, *, revoke: bool = True) -> None:
        """Stop renewing; revoke the lease (deleting its keys) unless ``revoke=False``."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        if revoke and self._id and not self.lost and not self._store.closed:
            with anyio.move_on_after(REVOKE_TIMEOUT, shield=True):
                try:
                    await self._store.lease_revoke(self._id)
                except LeaseNotFoundError:
                    pass
                except StoreError as exc:
                    log.warning("could not revoke lease %#x (it will expire): %s", self._id, exc)

    # -- what users read

    @property
    def id(self) -> int:
        """The lease id, to pass as ``lease=`` to ``put``/``compare_and_swap``."""
        if not self._id:
            raise RuntimeError("the lease keeper has not started")
        return self._id

    @property
    def lost(self) -> bool:
        return self._error is not None

    @property
    def error(self) -> LeaseExpiredError | None:
        """Why the lease was lost, once it was."""
        return self._error

    async def wait_lost(self) -> LeaseExpiredError:
        """Wait until the lease is lost; return the error that says why."""
        await self._lost.wait()
        assert self._error is not None
        return self._error

    def on_lost(self, callback: Callable[[LeaseExpiredError], object]) -> None:
        """Call ``callback(error)`` when the lease is lost (at once if it already is)."""
        if self._error is not None:
            callback(self._error)
        else:
            self._callbacks.append(callback)

    @contextlib.contextmanager
    def guard(self) -> Iterator[anyio.CancelScope]:
        """A scope that is cancelled if the lease is lost, then raises ``LeaseExpiredError``.

        ``with keeper.guard(): ...`` makes work that is only valid while the lease lives stop
        when it is lost, rather than go on as if it still held (two lock holders, two leaders).
        """
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            if self._error is not None:
                scope.cancel()
            try:
                yield scope
            finally:
                self._scopes.discard(scope)
        if scope.cancelled_caught and self._error is not None:
            raise self._error

    def statistics(self) -> LeaseKeeperStatistics:
        return LeaseKeeperStatistics(
            self._id, self.ttl, self._renewals, self._failures, self._last_renewal, self.lost
        )

    # -- the background task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._interval if self._interval is not None else self.ttl / 3
        delay = interval
        while True:
            await asyncio.sleep(delay)
            try:
                if self._renew_deadline is None:
                    self.ttl = await self._store.lease_keep_alive(self._id)
                else:  # a renewal still hanging at the renew deadline counts as failed
                    left = self._last_renewal + self._renew_deadline - loop.time()
                    with anyio.move_on_after(max(0.0, left)) as scope:
                        self.ttl = await self._store.lease_keep_alive(self._id)
                    if scope.cancelled_caught:
                        self._lose(
                            f"not renewed within the renew deadline ({self._renew_deadline}s)"
                        )
                        return
            except LeaseNotFoundError:
                self._lose("expired or revoked")
                return
            except StoreClosedError:
                self._lose("the store was closed")
                return
            except (StoreConnectionError, StoreTimeoutError) as exc:
                self._failures += 1
                limit = self.ttl if self._renew_deadline is None else self._renew_deadline
                left = self._last_renewal + limit - loop.time()
                if left <= 0:
                    what = "TTL" if self._renew_deadline is None else "renew deadline"
                    self._lose(f"store unreachable for the whole {what} ({exc})")
                    return
                log.warning("lease %#x keep-alive failed, retrying: %s", self._id, exc)
                delay = min(interval, max(left / 4, 0.01))
                continue
            self._renewals += 1
            self._last_renewal = loop.time()
            delay = interval

    def _lose(self, reason: str) -> None:
        error = LeaseExpiredError(self._id, reason)
        self._error = error
        self._lost.set()
        log.warning("%s", error)
        for scope in self._scopes:
            scope.cancel()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(error)
            except Exception:
                log.exception("lease-lost callback %r failed", callback)
