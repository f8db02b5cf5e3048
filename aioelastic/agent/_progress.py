"""What a run got through: its rounds, its restarts (a restart that a node's loss caused is given
back) and the restart latencies; and how long it keeps rejoining an unreachable store."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..rendezvous import RendezvousResult

__all__ = ["RejoinBudget", "RunProgress"]

log = logging.getLogger("aioelastic.agent")

#: Backoff between rejoins while the store is unreachable (seconds, doubling).
RETRY_FIRST = 0.1
RETRY_MAX = 2.0


@dataclass(slots=True)
class RunProgress:
    """The agent's observable progress and its restart accounting.

    ``failed_at``/``restart_reason``: a failure or change was detected then, for that reason;
    the next workers' start measures the restart latency from it. ``restarted_from``: the round
    a counted restart left, until the next round shows whether it lost a node.
    """

    nproc_per_node: int
    max_restarts: int
    round: int | None = None
    group_rank: int | None = None
    world_size: int | None = None
    restarts: int = 0
    rounds: int = 0
    latencies: list[float] = field(default_factory=list)
    failed_at: float | None = None
    restart_reason: str | None = None
    restarted_from: RendezvousResult | None = None

    @property
    def restart_left(self) -> bool:
        return self.restarts < self.max_restarts

    def joined(self, rdzv: RendezvousResult) -> None:
        """A round was formed: count it (and give back the restart its loss caused)."""
        if self.restarted_from is not None:
            self._refund_restart(self.restarted_from, rdzv)
            self.restarted_from = None
        self.rounds += 1
        self.round, self.group_rank = rdzv.round, rdzv.rank
        self.world_size = rdzv.world_size * self.nproc_per_node

    def interrupted(self, now: float, reason: str) -> None:
        """The workers stop at ``now`` for ``reason``: the restart latency runs from here."""
        self.failed_at = now
        self.restart_reason = reason

    def count_restart(self, left: RendezvousResult) -> None:
        """A restart after a worker failure, leaving round ``left``."""
        self.restarts += 1
        self.restarted_from = left
        self.restart_reason = "worker_failed"

    def workers_running(self, now: float) -> float | None:
        """The workers are up again at ``now``: the restart's latency (None on the first start)."""
        if self.failed_at is None:
            return None
        self.latencies.append(now - self.failed_at)
        self.failed_at = None
        return self.latencies[-1]

    def _refund_restart(self, left: RendezvousResult, rdzv: RendezvousResult) -> None:
        """A counted restart whose next round lacks a node of the round it left was the loss's
        consequence, not a failure of the job: give it back.

        The round right after the one left says how many of its members departed (its round
        record does, O(1) bytes for each member); only for another round (a round was missed),
        or a record that does not say, are the two rounds' participants compared."""
        if rdzv.round == left.round + 1 and rdzv.departed is not None:
            lost = rdzv.departed
            which = f"{lost} node(s)"
        else:
            gone = sorted(set(left.participants) - set(rdzv.participants))
            lost, which = len(gone), "node(s) " + ", ".join(gone)
        if lost and self.restarts > 0:
            self.restarts -= 1
            log.info(
                "round %d: %s of round %d are gone: the failure was their loss's "
                "consequence, not counted as a restart",
                rdzv.round,
                which,
                left.round,
            )


@dataclass(slots=True)
class RejoinBudget:
    """Rejoining while the store is unreachable: for up to ``timeout`` seconds from the first
    failed join, with a doubling backoff; :meth:`reset` once a round forms."""

    timeout: float
    since: float | None = None
    backoff: float = RETRY_FIRST

    def reset(self) -> None:
        self.since, self.backoff = None, RETRY_FIRST

    def start(self, now: float) -> bool:
        """Note an unreachable store at ``now``; True when this begins an outage."""
        if self.since is not None:
            return False
        self.since = now
        return True

    def next_delay(self, now: float) -> float | None:
        """The wait before the next join, or None when the budget is spent."""
        assert self.since is not None
        left = self.since + self.timeout - now
        if left <= 0:
            return None
        delay, self.backoff = min(self.backoff, left), min(self.backoff * 2, RETRY_MAX)
        return delay
