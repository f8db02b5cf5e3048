"""LeaseKeeper: a lease kept alive in the background, whose loss is reported, never swallowed."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
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
from ._deadlines import Deadlines

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
    Any other error that ends the renewal (a refused token after a rotation, a bug) is a loss
    too, reported the same way with that error as the loss's ``__cause__``: a keeper never stops
    renewing without saying so.

    Connection errors are retried until the TTL since the last renewal has passed: a store that
    comes back in time costs nothing. With ``renew_deadline`` (shorter than the TTL), the keeper
    gives up earlier: once ``renew_deadline`` seconds pass without a successful renewal (failed or
    still hanging), the lease counts as lost although the store may keep it until the TTL, so the
    holder stops before anyone else can take over (Kubernetes leader election's rule).

    Between renewals a keeper holds only its deadline, on the one timer that the keepers of an
    event loop share (:mod:`._deadlines`); each renewal is a plain asyncio task owned by this
    object (so a keeper can be entered and closed in different tasks, e.g. a pytest-asyncio
    fixture). No task sleeps per lease, nor a timer handle waits per lease: a process that keeps
    thousands of leases (one per rendezvous participant) pays a heap entry each.
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
        self._task: asyncio.Task[None] | None = None  # the renewal in flight
        self._due = 0  # the next renewal's token in the loop's renewals, while none is in flight
        self._due_in: Deadlines[LeaseKeeper] | None = None  # the loop's, shared by its keepers
        self._context: contextvars.Context | None = None  # renewals run in a copy of start's
        self._started = False
        self._lost: asyncio.Event | None = None  # made by the first wait_lost
        self._error: LeaseExpiredError | None = None
        # on_lost's callbacks: the one a participant registers in ``_callback``, a list only
        # for more (a list per keeper would be one more object for every full collection)
        self._callback: Callable[[LeaseExpiredError], object] | None = None
        self._callbacks: list[Callable[[LeaseExpiredError], object]] | None = None
        # The guards' scopes: the one guard a participant holds in ``_scope``, a set only for
        # more at once. A keeper lives as long as its lease, and every full garbage collection
        # traverses what it holds (thousands of keepers in a large job's process).
        self._scope: anyio.CancelScope | None = None
        self._scopes: set[anyio.CancelScope] | None = None
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
        if self._started:
            raise RuntimeError("the lease keeper has already started")
        grant = await self._store.lease_grant(self._requested_ttl)
        self._started = True
        self._id = grant.id
        self.ttl = grant.ttl
        loop = asyncio.get_running_loop()
        self._last_renewal = loop.time()
        self._context = contextvars.copy_context()
        interval = self._interval if self._interval is not None else self.ttl / 3
        self._interval = interval
        if not self._closed:
            self._schedule(interval)

    async def aclose(self, *, revoke: bool = True) -> None:
        """Stop renewing; revoke the lease (deleting its keys) unless ``revoke=False``."""
        if self._closed:
            return
        self._closed = True
        if self._due and self._due_in is not None:  # (on the loop it was set on)
            self._due_in.cancel(self._due)
            self._due = 0
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
        if self._error is None:
            if self._lost is None:
                self._lost = asyncio.Event()
            await self._lost.wait()
        assert self._error is not None
        return self._error

    def on_lost(self, callback: Callable[[LeaseExpiredError], object]) -> None:
        """Call ``callback(error)`` when the lease is lost (at once if it already is)."""
        if self._error is not None:
            callback(self._error)
        elif self._callback is None:
            self._callback = callback
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def guard(self) -> contextlib.AbstractContextManager[anyio.CancelScope]:
        """A scope that is cancelled if the lease is lost, then raises ``LeaseExpiredError``.

        ``with keeper.guard(): ...`` makes work that is only valid while the lease lives stop
        when it is lost, rather than go on as if it still held (two lock holders, two leaders).
        """
        return _Guard(self)

    def statistics(self) -> LeaseKeeperStatistics:
        return LeaseKeeperStatistics(
            self._id, self.ttl, self._renewals, self._failures, self._last_renewal, self.lost
        )

    # -- the background task

    def _schedule(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._due_in = renewals = _renewals(loop)
        self._due = renewals.add(loop, loop.time() + delay, self)

    def _renewal_due(self) -> None:
        self._due = 0
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(
            self._renew(), name=f"aioelastic-lease-{self._id:x}", context=self._context
        )
        self._task.add_done_callback(self._on_renewal_done)

    def _on_renewal_done(self, task: asyncio.Task[None]) -> None:
        """A renewal that raised, or was cancelled other than by :meth:`aclose`, is a loss."""
        exc = None if task.cancelled() else task.exception()  # retrieved: no "never retrieved"
        if self._error is not None or self._closed or not (task.cancelled() or exc):
            return
        if self._task is task:
            self._task = None
        if exc is None:
            self._lose("the keep-alive task was cancelled")
            return
        self._failures += 1
        self._lose(f"keep-alive failed: {type(exc).__name__}: {exc}", cause=exc)

    async def _renew(self) -> None:
        """One keep-alive; schedules the next one unless the lease is lost."""
        delay = await self._keep_alive()
        self._task = None
        if delay is not None and not self._closed:
            self._schedule(delay)

    async def _keep_alive(self) -> float | None:
        """Renew once: the delay until the next renewal, or None once the lease is lost."""
        loop = asyncio.get_running_loop()
        interval = self._interval
        assert interval is not None
        try:
            # A renewal still hanging at the renew deadline (or, without one, when the TTL has
            # passed: the server has ended the lease) counts as failed; a store that cannot
            # connect yet keeps trying within that deadline (the http store's backoff).
            limit = self.ttl if self._renew_deadline is None else self._renew_deadline
            left = self._last_renewal + limit - loop.time()
            with anyio.move_on_after(max(0.0, left)) as scope:
                self.ttl = await self._store.lease_keep_alive(self._id)
            if scope.cancelled_caught:
                if self._renew_deadline is None:
                    self._lose(f"store unreachable for the whole TTL ({limit:g}s)")
                else:
                    self._lose(f"not renewed within the renew deadline ({self._renew_deadline}s)")
                return None
        except LeaseNotFoundError:
            self._lose("expired or revoked")
            return None
        except StoreClosedError:
            self._lose("the store was closed")
            return None
        except (StoreConnectionError, StoreTimeoutError) as exc:
            self._failures += 1
            limit = self.ttl if self._renew_deadline is None else self._renew_deadline
            left = self._last_renewal + limit - loop.time()
            if left <= 0:
                what = "TTL" if self._renew_deadline is None else "renew deadline"
                self._lose(f"store unreachable for the whole {what} ({exc})")
                return None
            log.warning("lease %#x keep-alive failed, retrying: %s", self._id, exc)
            return min(interval, max(left / 4, 0.01))
        self._renewals += 1
        self._last_renewal = loop.time()
        return interval

    def _lose(self, reason: str, *, cause: BaseException | None = None) -> None:
        error = LeaseExpiredError(self._id, reason)
        error.__cause__ = cause
        self._error = error
        if self._lost is not None:
            self._lost.set()
        log.warning("%s", error)
        if self._scope is not None:
            self._scope.cancel()
        for scope in self._scopes or ():
            scope.cancel()
        callbacks = [] if self._callback is None else [self._callback]
        callbacks.extend(self._callbacks or ())
        self._callback = self._callbacks = None
        for callback in callbacks:
            try:
                callback(error)
            except Exception:
                log.exception("lease-lost callback %r failed", callback)


def _renewal_due(keeper: LeaseKeeper) -> None:
    keeper._renewal_due()


#: the keepers' renewal deadlines, per event loop (one timer per loop, not one per keeper)
_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines[LeaseKeeper]] = (
    weakref.WeakKeyDictionary()
)


def _renewals(loop: asyncio.AbstractEventLoop) -> Deadlines[LeaseKeeper]:
    renewals = _by_loop.get(loop)
    if renewals is None:
        renewals = _by_loop[loop] = Deadlines(_renewal_due)
    return renewals


class _Guard:
    """:meth:`LeaseKeeper.guard`: a cancel scope the keeper cancels when its lease is lost.

    A class rather than a generator context manager: every waiting participant holds one for as
    long as it waits, and this is one tracked object where the generator form took two.
    """

    __slots__ = ("_keeper", "_scope")

    def __init__(self, keeper: LeaseKeeper) -> None:
        self._keeper = keeper
        self._scope: anyio.CancelScope | None = None

    def __enter__(self) -> anyio.CancelScope:
        if self._scope is not None:
            raise RuntimeError("a lease guard can be entered only once")
        keeper = self._keeper
        scope = self._scope = anyio.CancelScope().__enter__()
        if keeper._scope is None:
            keeper._scope = scope
        else:
            if keeper._scopes is None:
                keeper._scopes = set()
            keeper._scopes.add(scope)
        if keeper._error is not None:
            scope.cancel()
        return scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        keeper, scope = self._keeper, self._scope
        assert scope is not None
        if keeper._scope is scope:
            keeper._scope = None
        elif keeper._scopes is not None:
            keeper._scopes.discard(scope)
        suppress = scope.__exit__(exc_type, exc, tb)
        if scope.cancelled_caught and keeper._error is not None:
            raise keeper._error
        return bool(suppress)
