"""Global parameters: a typed JSON view over a run's key space, with compare-and-swap updates
and a watch for changes.

Each parameter is a key ``prefix/name`` holding JSON. An optional schema maps names to Python
types; values are checked on write and on read (a value written by someone else that does not
fit raises an error naming the parameter).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Self

from anyio.abc import AsyncResource

from ..errors import StoreConnectionError
from ..store import EventType, KeyValue, Store
from ._common import JSONValue, ResumingWatch, check_name, decode_json, encode_json

__all__ = ["ParameterChange", "ParameterValue", "ParameterWatch", "Parameters"]

_MISSING = object()

SchemaType = type | tuple[type, ...]


@dataclass(frozen=True, slots=True)
class ParameterValue:
    """A parameter's value with the revision of its last write (pass it to
    :meth:`Parameters.compare_and_set`) and its version (writes since creation)."""

    name: str
    value: JSONValue
    revision: int
    version: int


@dataclass(frozen=True, slots=True)
class ParameterChange:
    """One change seen by :meth:`Parameters.watch`: a new ``value``, or ``deleted``."""

    name: str
    value: JSONValue
    revision: int
    deleted: bool = False


def _fits(value: object, expected: SchemaType) -> bool:
    types = expected if isinstance(expected, tuple) else (expected,)
    for kind in types:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind is int and isinstance(value, bool):
            continue
        if kind is type(None) and value is None:
            return True
        if isinstance(value, kind):
            return True
    return False


def _type_name(expected: SchemaType) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    return " | ".join(t.__name__ for t in types)


class Parameters:
    """The parameters under ``prefix`` in ``store``, as JSON values.

    ``schema`` (optional) maps each parameter name to the type(s) its value must have
    (``{"lr": float, "batch_size": int, "stage": str}``); with a schema, other names are
    refused. ``float`` accepts ints; ``int`` refuses bools.
    """

    def __init__(
        self,
        store: Store,
        prefix: str = "params",
        *,
        schema: Mapping[str, SchemaType] | None = None,
    ) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self.store = store
        self.prefix = check_name(prefix, "prefix") + "/"
        if schema is not None:
            for key, kind in schema.items():
                check_name(key, "schema key")
                kinds = kind if isinstance(kind, tuple) else (kind,)
                if not kinds or not all(isinstance(k, type) for k in kinds):
                    raise TypeError(f"schema[{key!r}] must be a type or a tuple of types")
        self.schema = None if schema is None else dict(schema)

    def __repr__(self) -> str:
        return f"<Parameters {self.prefix!r}>"

    # -- checks

    def _key(self, name: str) -> str:
        check_name(name, "parameter name")
        if self.schema is not None and name not in self.schema:
            raise KeyError(f"unknown parameter {name!r}; the schema has {sorted(self.schema)}")
        return self.prefix + name

    def _check(self, name: str, value: object, where: str) -> None:
        if self.schema is None:
            return
        expected = self.schema.get(name)
        if expected is not None and not _fits(value, expected):
            raise TypeError(
                f"parameter {name!r} must be {_type_name(expected)}, got "
                f"{type(value).__name__} {value!r:.60} ({where})"
            )

    def _encode(self, name: str, value: JSONValue) -> bytes:
        self._check(name, value, "writing")
        return encode_json(value, f"parameter {name!r}")

    def _entry(self, kv: KeyValue) -> ParameterValue:
        name = kv.key[len(self.prefix) :]
        value = decode_json(kv.value, f"parameter {name!r}")
        self._check(name, value, f"stored at revision {kv.mod_revision}")
        return ParameterValue(name, value, kv.mod_revision, kv.version)

    # -- reads

    async def get(self, name: str, default: JSONValue = _MISSING) -> JSONValue:
        """The value of ``name``; ``default`` if it is unset (``KeyError`` without a default)."""
        entry = await self.get_entry(name)
        if entry is not None:
            return entry.value
        if default is _MISSING:
            raise KeyError(f"parameter {name!r} is not set")
        return default

    async def get_entry(self, name: str) -> ParameterValue | None:
        """The value of ``name`` with its revision, or None if unset."""
        kv = await self.store.get(self._key(name))
        return None if kv is None else self._entry(kv)

    async def snapshot(self) -> dict[str, JSONValue]:
        """Every parameter's value, read at one revision."""
        result = await self.store.range(self.prefix)
        return {entry.name: entry.value for entry in map(self._entry, result)}

    # -- writes

    async def set(self, name: str, value: JSONValue) -> int:
        """Set ``name`` to ``value`` unconditionally; return the revision of the write."""
        key = self._key(name)
        return await self.store.put(key, self._encode(name, value))

    async def compare_and_set(self, name: str, value: JSONValue, *, expected_revision: int) -> bool:
        """Set ``name`` only if its last write was at ``expected_revision`` (0: only if unset)."""
        key = self._key(name)
        result = await self.store.compare_and_swap(
            key, expected_revision, self._encode(name, value)
        )
        return result.succeeded

    async def update(
        self, name: str, change: Callable[[JSONValue], JSONValue], *, default: JSONValue = None
    ) -> ParameterValue:
        """Apply ``change(current)`` (``default`` if unset) atomically; return the new value.

        A compare-and-swap loop: if someone else wrote in between, ``change`` runs again on
        their value. Only writes that certainly did not apply are ever redone.
        """
        key = self._key(name)
        kv = await self.store.get(key)
        while True:
            current = default if kv is None else self._entry(kv).value
            data = self._encode(name, change(current))
            result = await self.store.compare_and_swap(
                key, 0 if kv is None else kv.mod_revision, data
            )
            if result.succeeded:
                assert result.kv is not None
                return self._entry(result.kv)
            kv = result.kv

    async def delete(self, name: str) -> bool:
        """Unset ``name``; return whether it was set."""
        return bool(await self.store.delete(self._key(name)))

    # -- changes

    def watch(
        self, names: Iterable[str] | None = None, *, start_revision: int | None = None
    ) -> ParameterWatch:
        """An async iterator of :class:`ParameterChange` (of ``names``, default all) from
        ``start_revision`` (default: from now on). ``async with`` it, or call ``aclose()``."""
        wanted = None if names is None else frozenset(names)
        if wanted is not None:
            for name in wanted:
                self._key(name)
        return ParameterWatch(self, wanted, start_revision)


class ParameterWatch(AsyncResource):
    """The changes of a :class:`Parameters` view, in revision order, each exactly once.

    Connection errors do not end it: it watches again from where it stopped. If the history it
    missed meanwhile has been compacted, it reads the parameters and reports what changed since
    its last change (the latest value of each name, and the deletions, at the read's revision:
    a compacted history cannot be replayed), then follows on. It raises
    :class:`~aioelastic.errors.CompactedError` if ``start_revision`` is already compacted when it
    opens, or if it falls behind the history while still replaying changes older than its open:
    re-read with :meth:`Parameters.snapshot` and watch again from its revision.
    """

    def __init__(
        self, params: Parameters, names: frozenset[str] | None, start_revision: int | None
    ) -> None:
        self._params = params
        self._names = names
        self._start_revision = start_revision
        self._watch = ResumingWatch(
            params.store, params.prefix, f"watching the parameters {params.prefix!r}", self._read
        )
        self._backlog: deque[ParameterChange] = deque()
        self._present: set[str] = set()  # the names set at the watch's position, from...
        self._known_from = 0  # ...the revision of the read at open
        self._opened = False
        self._closed = False

    async def _open(self) -> None:
        if self._opened:
            return
        while True:
            try:
                snapshot = await self._params.store.range(self._params.prefix)
                break
            except StoreConnectionError as exc:
                await self._watch.pause(exc)
        prefix_len = len(self._params.prefix)
        self._present = {kv.key[prefix_len:] for kv in snapshot}
        self._known_from = snapshot.revision
        if self._start_revision is None:
            self._watch.start_after(snapshot.revision)  # from now on: after this read
        else:
            await self._watch.open(self._start_revision)
        self._opened = True

    async def _read(self) -> int:
        """After a compaction: queue what changed since the watch's position."""
        compacted = self._watch.compacted
        if compacted is not None and self._watch.position <= self._known_from:
            raise compacted  # the names set before the gap are unknown: deletions could be lost
        snapshot = await self._params.store.range(self._params.prefix)
        prefix_len = len(self._params.prefix)
        now: set[str] = set()
        for kv in sorted(snapshot, key=lambda kv: kv.mod_revision):
            name = kv.key[prefix_len:]
            now.add(name)
            if not self._watch.delivered(kv.mod_revision, kv.key):
                self._backlog.append(self._change(name, kv))
        for name in sorted(self._present - now):
            self._backlog.append(ParameterChange(name, None, snapshot.revision, deleted=True))
        self._present = now
        return snapshot.revision

    def _change(self, name: str, kv: KeyValue) -> ParameterChange:
        entry = self._params._entry(kv)
        return ParameterChange(name, entry.value, entry.revision)

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ParameterChange:
        if self._closed:
            raise StopAsyncIteration
        await self._open()
        prefix_len = len(self._params.prefix)
        while True:
            while self._backlog:
                change = self._backlog.popleft()
                if self._names is None or change.name in self._names:
                    return change
            event = await self._watch.next()
            if event is None:
                continue  # the parameters were read again
            name = event.kv.key[prefix_len:]
            if event.revision > self._known_from:
                if event.type is EventType.DELETE:
                    self._present.discard(name)
                else:
                    self._present.add(name)
            if self._names is not None and name not in self._names:
                continue
            if event.type is EventType.DELETE:
                return ParameterChange(name, None, event.revision, deleted=True)
            return self._change(name, event.kv)

    async def aclose(self) -> None:
        self._closed = True
        await self._watch.aclose()
