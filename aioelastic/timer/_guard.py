"""The guard held around a block of work (:func:`expires`) and the process-wide client it uses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
from types import TracebackType
from typing import Self

import anyio

from ..errors import TimerExpiredError
from ._client import TimerClient
from ._wire import check_duration, check_scope_id

__all__ = ["TimerGuard", "configure", "expires", "get_client"]

log = logging.getLogger("aioelastic.timer")


#: How long a guard waits for the release of its timer before giving up (the server then reaps).
RELEASE_TIMEOUT = 5.0

# -- the guard users hold around a block of work ---------------------------------------------------

_global_client: TimerClient | None = None


def configure(client: TimerClient | None) -> None:
    """Set the process-wide client :func:`expires` uses when none is passed (None: unset)."""
    global _global_client
    if client is not None and not isinstance(client, TimerClient):
        raise TypeError(f"client must be a TimerClient or None, got {type(client).__name__}")
    _global_client = client


def get_client() -> TimerClient | None:
    """The client set by :func:`configure`, if any."""
    return _global_client


# Frames skipped when finding the code that asked for a timer: this package's own (expires, the
# guard, the blocking client), contextlib's (a `with` of a generator context manager) and the
# trampolines mutmut puts around every function it mutates (scripts/mutants).
_PASSED_THROUGH = ("aioelastic.timer.", "mutmut.")


def _is_own(module: str) -> bool:
    return module == "contextlib" or module.startswith(_PASSED_THROUGH)


def _caller_scope() -> str:
    """The ``file#line`` of the first frame outside this package: the code that asked for a timer.

    Found by module rather than by a fixed depth, so a wrapper frame this package (or a tool
    around it) adds does not move the default scope.
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and _is_own(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}#{frame.f_lineno}"


class TimerGuard:
    """A watchdog timer around a block of work: ``async with expires(after=5): ...``.

    Entering arms the scope's timer on the client (so its server reaps the worker if the block
    hangs, even where this process cannot help itself: a blocked loop, a hung C call) and puts
    the block under a cancel scope with the same deadline, so a block that overruns while the
    loop runs is interrupted with :class:`~aioelastic.errors.TimerExpiredError`. Leaving in time
    — normally, by an exception, or cancelled from outside — releases the timer (in ``finally``,
    shielded). A block interrupted at its deadline does *not* release: the timer expired and the
    server reaps the worker, exactly once; and a block cut at its deadline raises even if it
    released its guard itself (it did not run to its end). Without a client (none passed, none
    configured) the guard is a local deadline only.

    Re-entering the same scope (recursion with the default ``file#line`` scope) replaces its
    timer on the server, as torch does. :meth:`cancel` stops the timer without reaping and lets
    the block run on unguarded. The guard is single-use.
    """

    def __init__(
        self,
        after: float,
        *,
        scope: str | None = None,
        client: TimerClient | None = None,
    ) -> None:
        self.after = check_duration(after)
        self.scope_id = check_scope_id(scope, "scope") if scope is not None else _caller_scope()
        if client is not None and not isinstance(client, TimerClient):
            raise TypeError(f"client must be a TimerClient, got {type(client).__name__}")
        self.client = client if client is not None else _global_client
        self._deadline: float | None = None
        self._cancel_scope: anyio.CancelScope | None = None
        self._state = "new"  # new | armed | released | cancelled | expired

    def __repr__(self) -> str:
        return f"<TimerGuard scope={self.scope_id!r} after={self.after} {self._state}>"

    @property
    def state(self) -> str:
        """``new``, ``armed``, ``released``, ``cancelled`` (by :meth:`cancel`) or ``expired``."""
        return self._state

    @property
    def deadline(self) -> float | None:
        """The loop time the block must finish by (``None`` before :meth:`acquire`)."""
        return self._deadline

    @property
    def remaining(self) -> float:
        """Seconds left before the deadline (``after`` before acquire, 0 once expired, ``inf``
        once cancelled)."""
        if self._deadline is None:
            return self.after
        if self._state == "expired":
            return 0.0
        if self._state == "cancelled":
            return math.inf
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def expires(self) -> float:
        """Seconds left before the deadline (same as :attr:`remaining`)."""
        return self.remaining

    @property
    def expired(self) -> bool:
        return self._state == "expired"

    async def acquire(self) -> None:
        """Arm the timer on the client; the deadline counts from now."""
        if self._state != "new":
            raise RuntimeError(f"this timer guard is {self._state}; guards are single-use")
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self.after
        if self.client is not None:
            try:
                await self.client.acquire(self.scope_id, self.after)
            except asyncio.CancelledError:
                # the request may have reached the server: disarm it, or this worker would be
                # reaped for a block it never ran
                self._state = "released"
                with contextlib.suppress(Exception):
                    await self._send_release()
                raise
        self._state = "armed"

    async def release(self) -> None:
        """Disarm the timer: the work is done (no-op unless armed)."""
        if self._state != "armed":
            return
        self._state = "released"
        await self._send_release()

    async def cancel(self) -> None:
        """Stop the timer without reaping; the rest of the block runs without a deadline."""
        if self._state != "armed":
            return
        self._state = "cancelled"
        if self._cancel_scope is not None:
            self._cancel_scope.deadline = math.inf
        await self._send_release()

    async def _send_release(self) -> None:
        if self.client is None:
            return
        if self.client.in_process:
            # an in-process release completes without suspending, so it cannot be interrupted
            await self.client.release(self.scope_id)
            return
        with anyio.move_on_after(RELEASE_TIMEOUT, shield=True) as scope:
            await self.client.release(self.scope_id)
        if scope.cancelled_caught:
            log.warning("release of timer scope %r timed out", self.scope_id)

    async def __aenter__(self) -> Self:
        await self.acquire()
        assert self._deadline is not None
        cancel_scope = anyio.CancelScope(deadline=self._deadline)
        cancel_scope.__enter__()
        self._cancel_scope = cancel_scope
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        cancel_scope = self._cancel_scope
        assert cancel_scope is not None
        try:
            swallowed = bool(cancel_scope.__exit__(exc_type, exc, tb))
        finally:
            if cancel_scope.cancelled_caught and self._state == "armed":
                self._state = "expired"
            else:
                await self.release()
        # cut at its deadline, the block raises, even if it released (or, racing the deadline,
        # cancelled) its guard first: it did not run to its end, and must not seem to have
        if cancel_scope.cancelled_caught:
            raise TimerExpiredError(
                f"timer of scope {self.scope_id!r} expired: the block ran past {self.after}s"
            ) from None
        return swallowed


def expires(
    after: float, scope: str | None = None, client: TimerClient | None = None
) -> TimerGuard:
    """A :class:`TimerGuard`: ``async with expires(after=5): ...`` must finish within 5 s.

    ``scope`` defaults to the caller's ``"file#line"`` (so recursion re-arms one timer);
    ``client`` defaults to the one set by :func:`configure` (none: a local deadline only).
    """
    return TimerGuard(after, scope=scope, client=client)
