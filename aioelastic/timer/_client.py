"""The client side of a timer: :class:`TimerClient`, the ABC every transport's client implements."""

from __future__ import annotations

import abc

from anyio.abc import AsyncResource

from ._wire import WorkerId, check_duration, check_scope_id

__all__ = ["TimerClient", "WorkerId"]


# -- the client ----------------------------------------------------------------------------------


class TimerClient(AsyncResource):
    """Acquires and releases timers for one worker on a :class:`TimerServer`.

    ``acquire(scope_id, after)`` arms (or re-arms: a scope has one timer per worker) the scope's
    timer to expire ``after`` seconds from now; ``release(scope_id)`` disarms it (releasing an
    unknown or already reaped scope is not an error). Both are validated here, once, then passed
    to the transport's ``_acquire``/``_release``.
    """

    #: True if the server shares this process's event loop (``acquire`` takes loop time).
    in_process: bool = False

    async def acquire(self, scope_id: str, after: float) -> None:
        """Arm the timer of ``scope_id`` to expire ``after`` seconds from now."""
        check_scope_id(scope_id)
        after = check_duration(after)
        await self._acquire(scope_id, after)

    async def release(self, scope_id: str) -> None:
        """Disarm the timer of ``scope_id`` (no-op if it is not armed)."""
        check_scope_id(scope_id)
        await self._release(scope_id)

    async def aclose(self) -> None:
        """Release the client's resources (connections); armed timers stay armed."""

    @abc.abstractmethod
    async def _acquire(self, scope_id: str, after: float) -> None: ...

    @abc.abstractmethod
    async def _release(self, scope_id: str) -> None: ...
