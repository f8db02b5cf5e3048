"""Named events with small JSON payloads: publish, await one, or follow a stream of them.

An event is a key ``prefix/name`` whose value is its JSON payload; publishing again replaces it
(and is a new occurrence). Waiting is a watch, so an event published before the wait started is
seen at once and one published later wakes the waiter without polling.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

import anyio
from anyio.abc import AsyncResource

from ..errors import SyncTimeoutError
from ..store import EventType, KeyValue, LeaseKeeper, Store
from ._common import (
    JSONValue,
    ResumingWatch,
    check_name,
    check_timeout,
    decode_json,
    encode_json,
)

__all__ = ["EventChannel", "EventStream", "PublishedEvent"]


@dataclass(frozen=True, slots=True)
class PublishedEvent:
    """One publication of the event ``name``: its JSON ``payload`` and the store ``revision``
    at which it was published (later publications have larger revisions)."""

    name: str
    payload: JSONValue
    revision: int


class EventChannel:
    """Named events under ``prefix`` in ``store``.

    ``await channel.publish("checkpoint-saved", {"step": 1200})``;
    ``event = await channel.wait("checkpoint-saved", timeout=60)``;
    ``async with channel.stream() as events: async for event in events: ...``.
    """

    def __init__(self, store: Store, prefix: str = "events") -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self.store = store
        self.prefix = check_name(prefix, "prefix") + "/"

    def __repr__(self) -> str:
        return f"<EventChannel {self.prefix!r}>"

    def _key(self, name: str) -> str:
        return self.prefix + check_name(name, "event name")

    def _event(self, kv: KeyValue) -> PublishedEvent:
        name = kv.key[len(self.prefix) :]
        return PublishedEvent(name, decode_json(kv.value, f"event {name!r}"), kv.mod_revision)

    async def publish(
        self, name: str, payload: JSONValue = None, *, lease: LeaseKeeper | None = None
    ) -> PublishedEvent:
        """Publish ``name`` with ``payload`` (JSON, at most 64 KiB); return the publication.

        With ``lease``, the event disappears when that lease ends (a "while I live" event).
        """
        key = self._key(name)
        data = encode_json(payload, f"the payload of event {name!r}")
        revision = await self.store.put(key, data, lease=0 if lease is None else lease.id)
        return PublishedEvent(name, decode_json(data, "payload"), revision)

    async def get(self, name: str) -> PublishedEvent | None:
        """The latest publication of ``name``, or None if it was never published (or cleared)."""
        kv = await self.store.get(self._key(name))
        return None if kv is None else self._event(kv)

    async def wait(
        self, name: str, *, after_revision: int = 0, timeout: float | None = None
    ) -> PublishedEvent:
        """Wait for a publication of ``name`` newer than ``after_revision``; return it.

        With the default ``after_revision=0`` an event published before the call returns at
        once. Raises :class:`~aioelastic.errors.SyncTimeoutError` after ``timeout`` seconds.
        """
        key = self._key(name)
        timeout = check_timeout(timeout)
        if isinstance(after_revision, bool) or not isinstance(after_revision, int):
            raise TypeError(f"after_revision must be an int, got {type(after_revision).__name__}")
        found: KeyValue | None = None

        async def read() -> int:
            nonlocal found
            snapshot = await self.store.range(key)
            for kv in snapshot:
                if kv.key == key and kv.mod_revision > after_revision:
                    found = kv
            return snapshot.revision

        with anyio.move_on_after(timeout):
            async with ResumingWatch(self.store, key, f"waiting for the event {name!r}", read) as w:
                await w.resync()
                while found is None:
                    event = await w.next()
                    if event is None:
                        continue  # the state was read again
                    kv = event.kv
                    is_new = kv.mod_revision > after_revision
                    if event.type is EventType.PUT and kv.key == key and is_new:
                        found = kv
                return self._event(found)
        raise SyncTimeoutError(f"timed out after {timeout}s waiting for the event {name!r}")

    def stream(
        self, names: Iterable[str] | None = None, *, start_revision: int | None = None
    ) -> EventStream:
        """An async iterator of publications (of ``names``, default all) from ``start_revision``
        (default: from now on). ``async with`` it, or call ``aclose()``."""
        wanted = None if names is None else frozenset(check_name(n, "names[]") for n in names)
        return EventStream(self, wanted, start_revision)

    async def clear(self, name: str | None = None) -> int:
        """Delete the event ``name`` (default: every event of the channel); return the count."""
        if name is None:
            return await self.store.delete_prefix(self.prefix)
        return await self.store.delete(self._key(name))


class EventStream(AsyncResource):
    """The publications of an :class:`EventChannel`, in revision order, each exactly once.

    Connection errors do not end it: it watches again from where it stopped. If the history it
    missed meanwhile has been compacted, it reads the channel and reports the publications it has
    not reported yet (the latest of each name: a compacted history cannot be replayed), then
    follows on. A ``start_revision`` already compacted when the stream opens raises
    :class:`~aioelastic.errors.CompactedError`.
    """

    def __init__(
        self, channel: EventChannel, names: frozenset[str] | None, start_revision: int | None
    ) -> None:
        self._channel = channel
        self._names = names
        self._start_revision = start_revision
        self._watch = ResumingWatch(
            channel.store, channel.prefix, f"the event stream {channel.prefix!r}", self._read
        )
        self._backlog: deque[KeyValue] = deque()
        self._opened = False
        self._closed = False

    async def _read(self) -> int:
        """After a compaction: queue the publications the stream has not reported yet."""
        snapshot = await self._channel.store.range(self._channel.prefix)
        missed = [kv for kv in snapshot if not self._watch.delivered(kv.mod_revision, kv.key)]
        self._backlog.extend(sorted(missed, key=lambda kv: kv.mod_revision))
        return snapshot.revision

    async def _open(self) -> None:
        if not self._opened:
            await self._watch.open(self._start_revision)
            self._opened = True

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    def __aiter__(self) -> Self:
        return self

    def _wanted(self, kv: KeyValue) -> bool:
        return self._names is None or kv.key[len(self._channel.prefix) :] in self._names

    async def __anext__(self) -> PublishedEvent:
        if self._closed:
            raise StopAsyncIteration
        await self._open()
        while True:
            while self._backlog:
                kv = self._backlog.popleft()
                if self._wanted(kv):
                    return self._channel._event(kv)
            event = await self._watch.next()
            if event is None or event.type is not EventType.PUT:
                continue
            if self._wanted(event.kv):
                return self._channel._event(event.kv)

    async def aclose(self) -> None:
        self._closed = True
        await self._watch.aclose()
