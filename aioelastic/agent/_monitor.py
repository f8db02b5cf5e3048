"""What ends one attempt (the workers of one round): :func:`watch_attempt` waits on the workers'
exits, the membership's changes and a stop request (no polling) and returns an :class:`Attempt`,
whose :class:`Outcome` is an enum mypy checks every branch of, not a string."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

from ..errors import RendezvousError
from ..rendezvous import RendezvousEvent, RendezvousResult
from ._group import WorkerGroup
from ._membership import Membership, is_loss
from ._result import WorkerFailure
from ._stops import StopRequest, settle
from ._workers import WorkerProcess

__all__ = ["Attempt", "Outcome", "watch_attempt"]


class Outcome(enum.Enum):
    """What ended one attempt, as :func:`watch_attempt` saw it."""

    SUCCEEDED = "succeeded"  # every local worker exited 0
    STOPPED = "stopped"  # a stop was requested
    FAILED = "failed"  # a worker failed (and no loss of a node came with it)
    CHANGED = "changed"  # a membership change, the run closed, or a rendezvous error


@dataclass(frozen=True, slots=True)
class Attempt:
    """An attempt's :class:`Outcome` with its detail: the failures, or the change."""

    outcome: Outcome
    failures: tuple[WorkerFailure, ...] = ()
    change: RendezvousEvent | BaseException | None = None


async def watch_attempt(
    rdzv: RendezvousResult, group: WorkerGroup, membership: Membership, stop: StopRequest
) -> Attempt:
    """Wait for the first thing that ends this attempt (no polling: exits and events)."""
    waiters: dict[asyncio.Task[Any], WorkerProcess] = {w.waiter: w for w in group.workers}
    changes = asyncio.ensure_future(membership.next_change(rdzv))
    stopper = asyncio.ensure_future(stop.wait())
    pending: set[asyncio.Future[Any]] = set(waiters)
    try:
        while True:
            done, _ = await asyncio.wait(
                pending | {changes, stopper}, return_when=asyncio.FIRST_COMPLETED
            )
            if stopper in done:
                return Attempt(Outcome.STOPPED)
            exited = [waiters[t] for t in done if isinstance(t, asyncio.Task) and t in waiters]
            pending -= {w.waiter for w in exited}
            failed = [w for w in exited if w.returncode != 0]
            if failed and changes in done and is_loss(changes):
                # the failures are the loss's consequence
                return Attempt(Outcome.CHANGED, change=changes.result())
            if failed:
                failures = tuple(group.failure(rdzv, w) for w in failed)
                return Attempt(Outcome.FAILED, failures=failures)
            if not pending:
                return Attempt(Outcome.SUCCEEDED)
            if changes in done:
                try:
                    return Attempt(Outcome.CHANGED, change=changes.result())
                except RendezvousError as exc:
                    return Attempt(Outcome.CHANGED, change=exc)
    finally:
        for task in (changes, stopper):
            task.cancel()
        await settle(changes, stopper)
