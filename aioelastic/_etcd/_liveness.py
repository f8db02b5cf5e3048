"""Finding a hung etcd member: ping a member that has gone silent while something waits on it.

A member that stops answering without closing its connections (frozen with SIGSTOP, stuck on a
dead disk, a wedged process) looks healthy to gRPC: the kernel keeps the TCP connection open, so
the channel stays READY until gRPC's own keep-alive gives up. That cannot be quick: etcd's
server refuses client pings more often than every 5 s by default (``--grpc-keepalive-min-time``;
it answers with GOAWAY ``too_many_pings``), so gRPC pings alone take 10-15 s to notice.

So a caller waiting on a member pings it itself once the member has been silent for
``ping_after`` seconds (nothing heard from it, by this caller or any other): a serializable
``Range``, which a member answers on its own, without its leader, so a healthy member answers at
once even during an election or under a slow write. Any answer, even an error, means the member
is alive. No answer within ``ping_timeout``, and nothing else heard from the member since the
ping was sent, and the member is hung: the caller gives up on it (:class:`MemberHungError`), and
the client moves to another member. A member that answers other calls while the ping waits is
busy, not hung (thousands of clients joining at once queue behind each other).

What has been heard from a member is shared by every client in the process that talks to it from
one event loop (:func:`member_liveness`; gRPC shares their TCP connection too): one ping at a time
per member, shared by every caller waiting on it, and nothing is sent while answers keep coming
to any of them, so N stores in one process cost no N pings.

A frozen *leader* leaves the members alive, but a call a member forwarded to it waits for etcd's
own request timeout (about 7 s) although a new leader is elected in about a second. Every answer
carries the raft term, so a call that is still waiting when a ping shows a newer term than the
one it was sent in is given up too (:class:`LeaderChangedError`): a read is repeated, a write's
outcome is unknown, a keep-alive is sent again. Watches are served by the member itself and are
left alone.
"""

from __future__ import annotations

import asyncio
import weakref

from ..errors import StoreConnectionError

__all__ = [
    "CallAbandonedError",
    "LeaderChangedError",
    "Liveness",
    "MemberHungError",
    "member_liveness",
]


class CallAbandonedError(StoreConnectionError):
    """A waiting call was given up (internal: the client translates it: a read is repeated, a
    write's outcome is unknown)."""


class MemberHungError(CallAbandonedError):
    """The member did not answer a ping while a call or stream waited on it."""


class LeaderChangedError(CallAbandonedError):
    """The cluster elected a new leader while a call forwarded to the old one waited."""


class Liveness:
    """What one channel has heard from its member: when last, the shared ping, a hung mark."""

    __slots__ = ("__weakref__", "hung", "last_heard", "ping", "term")

    def __init__(self) -> None:
        self.last_heard = 0.0
        self.term = 0  # the highest raft term an answer carried
        #: the ping in flight: True (alive), False (hung), None (no verdict: its client closed)
        self.ping: asyncio.Future[bool | None] | None = None
        #: Why the member was taken as hung (None: not hung); cleared by its next answer.
        self.hung: str | None = None

    def heard(self, answer: object = None) -> None:
        """An answer came (``answer``: the response, whose header's raft term is noted)."""
        self.last_heard = asyncio.get_running_loop().time()
        self.hung = None
        header = getattr(answer, "header", None)
        term = getattr(header, "raft_term", 0)
        if isinstance(term, int) and term > self.term:
            self.term = term

    def quiet_until(self, since: float, ping_after: float) -> float:
        """When silence since ``since`` (or the last answer, if later) reaches ``ping_after``."""
        return max(since, self.last_heard) + ping_after


_SHARED: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakValueDictionary[str, Liveness]
] = weakref.WeakKeyDictionary()


def member_liveness(target: str) -> Liveness:
    """The liveness of the member at ``target`` (``host:port``) shared by every client of the
    running event loop (a fresh one outside a loop). Kept while a client holds it."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return Liveness()
    members = _SHARED.get(loop)
    if members is None:
        members = _SHARED[loop] = weakref.WeakValueDictionary()
    live = members.get(target)
    if live is None:
        live = members[target] = Liveness()
    return live
