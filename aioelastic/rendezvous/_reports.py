"""What a dynamic rendezvous handler reports: its structured events (:mod:`aioelastic.events`),
its status transitions and the statistics behind :meth:`statistics`.

:class:`ReportingHandler` sits between :class:`~.api._BuiltinHandler` (the status from three
flags) and :class:`~.dynamic.DynamicRendezvousHandler` (which sets the attributes declared
here); the join's parts report through ``_emit``, ``_note_status`` and ``_on_lease_lost``.
Structured events never raise, and cost next to nothing with no sink.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import events as _events
from .api import RendezvousStatistics, RendezvousStatus, _BuiltinHandler

if TYPE_CHECKING:
    from ..errors import LeaseExpiredError
    from ..events import EventSink
    from ..store import LeaseKeeper
    from .api import RendezvousResult


@dataclass(slots=True)
class Stats:
    """The counters behind :meth:`ReportingHandler.statistics` (event-loop time)."""

    joins: int = 0
    rounds_driven: int = 0
    join_started: float | None = None
    completed_at: float | None = None
    last_call_deadline: float | None = None


class ReportingHandler(_BuiltinHandler):
    """The reporting half of the dynamic handler: statistics, events, status transitions."""

    #: where structured events go (see :mod:`aioelastic.events`)
    event_sink: EventSink
    _stats: Stats
    _reported_status: RendezvousStatus
    _node_id: str
    _round: int
    _result: RendezvousResult | None
    _keeper: LeaseKeeper | None

    def statistics(self) -> RendezvousStatistics:
        """A snapshot of this handler (times in event-loop time)."""
        keeper, stats = self._keeper, self._stats
        return RendezvousStatistics(
            node_id=self._node_id,
            status=self.status,
            round=self._round,
            world_size=0 if self._result is None else self._result.world_size,
            joins=stats.joins,
            rounds_driven=stats.rounds_driven,
            join_started=stats.join_started,
            completed_at=stats.completed_at,
            last_call_deadline=stats.last_call_deadline,
            lease_id=0 if keeper is None or keeper.lost else keeper.id,
        )

    def _on_lease_lost(self, error: LeaseExpiredError) -> None:
        if not self._handler_closed:
            self._error = error
            self._emit("rendezvous.lease_lost", round=self._round, error=str(error))
            self._note_status()

    def _emit(self, kind: str, **fields: Any) -> None:
        _events.emit(self.event_sink, kind, run_id=self.run_id, node=self._node_id, **fields)

    def _note_status(self) -> None:
        """Emit ``rendezvous.status`` if the status changed since the last call."""
        status = self.status
        if status is not self._reported_status:
            previous, self._reported_status = self._reported_status, status
            error = self._error
            self._emit(
                "rendezvous.status",
                status=status.value,
                previous=previous.value,
                round=self._round,
                error=None if error is None else f"{type(error).__name__}: {error}",
            )
