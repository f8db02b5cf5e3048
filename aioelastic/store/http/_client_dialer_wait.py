"""What the dialer of a session connection awaits before the connection is attached: the
upgrade's answer, then the hello's, each resolved by the connection's protocol callbacks. A
base of :class:`~._client_conn.Connection` (its own room: the connection's messages after
the attach are the rest of it)."""

from __future__ import annotations

import asyncio
from typing import Any

from ._upgrade_answer import Answer

__all__ = ["DialerWait"]


class DialerWait:
    """The dialer's one waiter (``Connection`` sets the fields in its ``__init__``)."""

    loop: asyncio.AbstractEventLoop
    lost: bool
    reason: str
    _early: list[bytes]
    _waiter: asyncio.Future[Any] | None

    async def answer(self) -> Answer:
        """The server's answer to the upgrade request (written by the dialer)."""
        answer: Answer = await self._wait()
        return answer

    async def next_message(self) -> bytes:
        """The next message (the hello's answer), before :meth:`attach`."""
        if self._early:
            return self._early.pop(0)
        message: bytes = await self._wait()
        return message

    async def _wait(self) -> Any:
        if self.lost:
            raise ConnectionResetError(self.reason or "the server closed the connection")
        self._waiter = waiter = self.loop.create_future()
        try:
            return await waiter
        finally:
            self._waiter = None

    def _resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(value)
