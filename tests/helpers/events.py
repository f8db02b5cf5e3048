"""An event sink that keeps what it is given, for tests that read a handler's structured events."""

from __future__ import annotations

from typing import Any

from aioelastic.events import Event


class ListSink:
    """Keeps every event (kind, fields), in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: str) -> list[dict[str, Any]]:
        """The fields of the events of ``kind``, in order."""
        return [dict(e.fields) for e in self.events if e.kind == kind]
