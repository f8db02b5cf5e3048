"""Structured events: what happened in a run, as JSON lines, for people and log pipelines.

The rendezvous handler (round completions, membership changes, status transitions), the timer
servers (reaps) and the agent (worker failures, restarts) *emit* :class:`Event` records to an
:class:`EventSink`. A sink is anything with ``emit(event) -> None``; the ones here are

- :class:`NullSink` (the default: events are dropped),
- :class:`JsonLinesSink` (one JSON object per line, appended to a file: each line is one
  ``write()`` on a descriptor opened with ``O_APPEND``, so several processes can share the file
  without interleaving lines),
- :class:`StreamSink` (JSON lines to a text stream such as ``sys.stderr``),
- :class:`ContextSink` (fills ``run_id``/``node`` into events that lack them, then forwards).

:func:`open_sink` turns a configuration string into a sink: a path, ``-`` (stderr), ``stdout``,
or empty (no events). :func:`default_sink` reads the ``AIOELASTIC_EVENTS`` environment variable
(the same forms); components given no sink use it.

Emitting never raises into the caller and never blocks the loop for long: a line is formatted and
written in one system call to a local file; a sink that fails is logged once and its events are
dropped (use :func:`emit` rather than ``sink.emit`` to get that guarantee for any sink). For a
slow destination (a network filesystem, a socket), write a sink that queues.

A line looks like::

    {"ts": "2026-11-30T04:05:07.123456Z", "time": 1795939507.123456, "kind":
     "rendezvous.round_completed", "run_id": "job1", "node": "a1b2c3", "emitter_pid": 4242,
     "round": 0, "rank": 0, "world_size": 2, ...}

See ``docs/observability.md`` for every kind and its fields.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
import time as _time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, runtime_checkable

__all__ = [
    "EVENTS_ENV",
    "ContextSink",
    "Event",
    "EventSink",
    "JsonLinesSink",
    "NullSink",
    "StreamSink",
    "default_sink",
    "emit",
    "open_sink",
    "resolve_sink",
]

log = logging.getLogger("aioelastic.events")

#: The environment variable that configures the default sink: a path, ``-`` (stderr), ``stdout``.
EVENTS_ENV = "AIOELASTIC_EVENTS"

#: Keys every line has; an event's fields cannot override them.
_RESERVED = frozenset({"ts", "time", "kind", "run_id", "node", "emitter_pid"})


@dataclass(frozen=True, slots=True)
class Event:
    """One structured event.

    ``kind`` is dotted (``rendezvous.round_completed``, ``timer.reaped``, ...); ``time`` is the
    wall-clock time (epoch seconds) it happened; ``run_id`` and ``node`` say where (None when
    the emitter does not know); ``emitter_pid`` is the emitting process; ``fields`` hold the
    rest (JSON-serialisable values; anything else is written as its ``str``).
    """

    kind: str
    run_id: str | None = None
    node: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=_time.time)
    emitter_pid: int = field(default_factory=os.getpid)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError(f"kind must be a non-empty dotted str, got {self.kind!r}")
        clash = _RESERVED.intersection(self.fields)
        if clash:
            raise ValueError(f"event fields must not use the reserved names {sorted(clash)}")

    @property
    def ts(self) -> str:
        """``time`` as UTC ISO 8601 with microseconds and a ``Z``."""
        moment = datetime.datetime.fromtimestamp(self.time, tz=datetime.UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of one line: ``ts, time, kind, run_id, node, emitter_pid``, then the
        fields."""
        out: dict[str, Any] = {
            "ts": self.ts,
            "time": round(self.time, 6),
            "kind": self.kind,
            "run_id": self.run_id,
            "node": self.node,
            "emitter_pid": self.emitter_pid,
        }
        out.update(self.fields)
        return out

    def to_json(self) -> str:
        """One line of JSON (no newline); values JSON cannot hold are written as ``str``."""
        return json.dumps(self.to_dict(), default=str, separators=(",", ":"))


@runtime_checkable
class EventSink(Protocol):
    """Where events go: ``emit`` is called on the event loop and must return quickly."""

    def emit(self, event: Event) -> None:
        """Record ``event`` (may raise: :func:`emit` logs a failing sink once and drops)."""


class NullSink:
    """Drops every event (the default when nothing is configured)."""

    def emit(self, event: Event) -> None:
        """Drop ``event``."""

    def __repr__(self) -> str:
        return "NullSink()"


#: the sink of every component made without one while ``AIOELASTIC_EVENTS`` is unset
_NULL_SINK = NullSink()


class JsonLinesSink:
    """Appends each event as one JSON line to ``path`` (created if missing, mode 0o644).

    The file is opened with ``O_APPEND`` on first use and every line goes out in one ``write()``,
    so processes sharing the file never interleave within a line. A failed write is logged once
    and the event dropped (later events are tried again). :meth:`close` closes the descriptor.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if not self.path:
            raise ValueError("path must not be empty (use NullSink for no events)")
        self._fd: int | None = None
        self._lock = threading.Lock()  # emitters on several threads/loops write whole lines
        self._warned = False

    def __repr__(self) -> str:
        return f"JsonLinesSink({self.path!r})"

    def emit(self, event: Event) -> None:
        """Append ``event`` as one line (one ``write()`` call)."""
        data = (event.to_json() + "\n").encode()
        with self._lock:
            try:
                if self._fd is None:
                    self._fd = os.open(
                        self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
                    )
                os.write(self._fd, data)
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("events: cannot write to %s (%s); dropping events", self.path, exc)

    def close(self) -> None:
        """Close the file (a later event opens it again)."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)


class StreamSink:
    """Writes each event as one JSON line to a text stream (default: ``sys.stderr`` at the time
    of each write), flushed after each line."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream

    def __repr__(self) -> str:
        return f"StreamSink({self.stream!r})"

    def emit(self, event: Event) -> None:
        """Write ``event`` as one line and flush."""
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(event.to_json() + "\n")
        stream.flush()


class ContextSink:
    """Forwards to ``sink``, filling ``run_id`` and ``node`` into events that have none.

    Used to tag the events of a component that does not know its run (a timer server) with the
    agent's run id and node.
    """

    def __init__(self, sink: EventSink, *, run_id: str | None = None, node: str | None = None):
        self.sink = sink
        self.run_id = run_id
        self.node = node

    def __repr__(self) -> str:
        return f"ContextSink({self.sink!r}, run_id={self.run_id!r}, node={self.node!r})"

    def emit(self, event: Event) -> None:
        """Fill the missing context into ``event`` and forward it."""
        if (event.run_id is None and self.run_id is not None) or (
            event.node is None and self.node is not None
        ):
            event = Event(
                event.kind,
                event.run_id if event.run_id is not None else self.run_id,
                event.node if event.node is not None else self.node,
                event.fields,
                event.time,
                event.emitter_pid,
            )
        self.sink.emit(event)


_failed: set[int] = set()  # ids of sinks that failed once (logged): later failures are silent


def emit(
    sink: EventSink | None,
    kind: str,
    *,
    run_id: str | None = None,
    node: str | None = None,
    **fields: Any,
) -> None:
    """Build an :class:`Event` and give it to ``sink``; never raises.

    A sink that raises is logged once (per sink) and the event dropped. ``None`` and a
    :class:`NullSink` cost almost nothing. Passwords in URLs in string fields (an error's text)
    are redacted (``user:***@``).
    """
    if sink is None or isinstance(sink, NullSink):
        return
    from ._secrets import redact_url  # light: the standard library only

    fields = {k: redact_url(v) if isinstance(v, str) else v for k, v in fields.items()}
    try:
        sink.emit(Event(kind, run_id, node, fields))
    except Exception:
        if id(sink) not in _failed:
            _failed.add(id(sink))
            log.exception("event sink %r failed; dropping its failing events", sink)


def open_sink(spec: str | None) -> EventSink:
    """A sink from a configuration string: a file path (JSON lines appended), ``-`` or
    ``stderr`` (JSON lines to stderr), ``stdout``, or ``None``/empty (a :class:`NullSink`)."""
    if spec is None:
        return NullSink()
    if not isinstance(spec, str):
        raise TypeError(f"an events destination must be a str, got {type(spec).__name__}")
    spec = spec.strip()
    if not spec:
        return NullSink()
    if spec in ("-", "stderr"):
        return StreamSink()
    if spec == "stdout":
        return StreamSink(sys.stdout)
    return JsonLinesSink(spec)


_env_sinks: dict[str, EventSink] = {}


def default_sink() -> EventSink:
    """The sink ``AIOELASTIC_EVENTS`` configures (one per value per process; unset: NullSink).

    Components created without an explicit sink use this, so ``AIOELASTIC_EVENTS=events.jsonl``
    turns on events for a whole program (and for the workers an agent starts, which inherit it).
    """
    spec = os.environ.get(EVENTS_ENV, "").strip()
    if not spec:
        return _NULL_SINK  # (stateless: one for all; 10,000 handlers in a process, one object)
    sink = _env_sinks.get(spec)
    if sink is None:
        sink = _env_sinks[spec] = open_sink(spec)
    return sink


def resolve_sink(sink: EventSink | None) -> EventSink:
    """``sink`` checked, or :func:`default_sink` when it is None (for constructors)."""
    if sink is None:
        return default_sink()
    if not isinstance(sink, EventSink):
        raise TypeError(f"events must be an EventSink (emit(event)), got {type(sink).__name__}")
    return sink
