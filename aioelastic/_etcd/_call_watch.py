"""Watching one unary call for a hung member without a task of its own.

A unary call is awaited directly; what watches it (see ``_liveness``) is one timer, due when
its member will have been silent for ``ping_after``. Most calls are answered long before: the
timer is cancelled and that is all the watching cost (no wrapper task, no ``asyncio.wait``
with its own timer per call: about a sixth of a rendezvous join's client CPU on etcd). Only a
call still waiting when the timer fires gets a task, which pings the member (the ping shared
with every other waiter) and, on a verdict, cancels the call and keeps the reason for the
caller to raise: :class:`MemberHungError` (no answer to the ping) or, for a call that needs the
leader, :class:`LeaderChangedError` (a ping showed a newer raft term than the call was sent in).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ._liveness import CallAbandonedError, LeaderChangedError, MemberHungError

if TYPE_CHECKING:
    from ._channels import MemberChannel, MemberChannels

__all__ = ["CallWatch"]


class CallWatch:
    """Watches ``call`` (a ``grpc.aio`` unary call on ``ch``) until :meth:`close`.

    ``verdict``: why the call was given up (it was cancelled then), None while it was not.
    """

    __slots__ = (
        "_call",
        "_ch",
        "_channels",
        "_check",
        "_generation",
        "_leader_bound",
        "_loop",
        "_sent_term",
        "_start",
        "_timer",
        "verdict",
    )

    def __init__(
        self, channels: MemberChannels, ch: MemberChannel, call: Any, *, leader_bound: bool
    ) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._channels, self._ch, self._call = channels, ch, call
        self._generation, self._leader_bound = ch.generation, leader_bound
        self._sent_term = ch.liveness.term
        self._start = loop.time()
        self._check: asyncio.Task[None] | None = None
        self.verdict: CallAbandonedError | None = None
        due = ch.liveness.quiet_until(self._start, channels.ping_after)
        self._timer: asyncio.TimerHandle | None = loop.call_at(due, self._due)

    def close(self) -> None:
        """The call ended, or its caller left it: stop watching."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._check is not None:
            self._check.cancel()  # it waits on the shared ping with asyncio.wait: not cancelled
            self._check = None

    def _due(self) -> None:
        self._timer = None
        if self._call.done():
            return
        due = self._ch.liveness.quiet_until(self._start, self._channels.ping_after)
        if due > self._loop.time():  # heard from meanwhile (another caller's answer)
            self._timer = self._loop.call_at(due, self._due)
            return
        self._check = self._loop.create_task(self._ping_until_answered())

    async def _ping_until_answered(self) -> None:
        """Ping the silent member until the call ends or a verdict cancels it (the loop of
        ``MemberChannels.wait_answer``, for a call nobody else waits on meanwhile)."""
        channels, ch, loop = self._channels, self._ch, self._loop
        live = ch.liveness
        while not self._call.done():
            wait = live.quiet_until(self._start, channels.ping_after) - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if ch.generation != self._generation:  # taken as hung by another caller meanwhile
                return self._give_up(MemberHungError(channels.hung_message(ch)))
            ping = channels.shared_ping(ch)
            await asyncio.wait((ping,))
            if self._call.done():
                return None
            alive = ping.result()
            if alive is None:  # the ping's own client closed under it: no verdict, ask again
                continue
            if not alive:
                channels.mark_hung(ch, self._generation)
                return self._give_up(MemberHungError(channels.hung_message(ch)))
            sent = self._sent_term
            if self._leader_bound and sent and live.term > sent:
                return self._give_up(
                    LeaderChangedError(
                        f"etcd elected a new leader (raft term {sent} -> {live.term}) while the "
                        f"call waited at {ch.endpoint}"
                    )
                )
            self._sent_term = sent or live.term  # nothing heard before: the first ping's term
        return None

    def _give_up(self, verdict: CallAbandonedError) -> None:
        self.verdict = verdict
        self._call.cancel()
