"""The session protocol's frames: msgpack arrays, several to one message of the session stream.

Shared by both ends (:mod:`._session_server`, :mod:`._session_client`); the protocol is described
in ``docs/http-api.md`` ("The session protocol"). Every frame is a msgpack array whose first item
is its kind. A message of the session stream (:mod:`._session_stream`) carries one or more frames
back to back, so that a batch of requests (or of answers) is one message and one write.

Client to server: ``[REQUEST, id, op, args]`` (``args`` a list). The first frame on a connection
must be the hello, ``[REQUEST, 0, "hello", {...}]``.
Server to client: ``[RESULT, id, value]``, ``[ERROR, id, code, message, extra]``, and for a watch
(whose id is the id of the request that opened it): ``[EVENTS, id, blob]`` (``blob``: the msgpack
of a list of events, encoded once for every watcher at the same position),
``[PROGRESS, id, revision]`` and ``[WATCH_END, id, code, message, extra]``. From version 2 on,
the events that several watches of a connection read alike are one frame,
``[EVENTS_MANY, [id, ...], blob]`` (one put seen by 1,000 watches of a session: one frame, not
1,000); a version-1 connection gets an ``EVENTS`` frame per watch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from .._records import new_event, new_kv, new_record, slot_setters
from .._types import EventType, KeyValue, LeaseStatus, RangeResult, WatchEvent

__all__ = [
    "ERROR",
    "EVENTS",
    "EVENTS_MANY",
    "EVENTS_MANY_VERSION",
    "NOT_ONE",
    "PROGRESS",
    "PROTOCOL_VERSIONS",
    "REQUEST",
    "RESULT",
    "SESSION_PATH",
    "WATCH_END",
    "FrameError",
    "decode_events",
    "encode_events",
    "kv_from_wire",
    "kv_to_wire",
    "new_event",
    "new_kv",
    "new_record",
    "pack",
    "pack_bound",
    "slot_setters",
    "unpack_all",
    "unpack_one",
    "unpack_rest",
]

#: Versions of the session protocol this package speaks, newest last.
PROTOCOL_VERSIONS: tuple[int, ...] = (1, 2)
#: The first version whose server sends :data:`EVENTS_MANY` frames.
EVENTS_MANY_VERSION = 2
#: The route of the session endpoint (an upgrade to the session stream).
SESSION_PATH = "/v1/session"

REQUEST = 0
RESULT = 1
ERROR = 2
EVENTS = 3
PROGRESS = 4
WATCH_END = 5
#: ``[EVENTS_MANY, [watch, ...], blob]``: the same events for each of these watches (version 2)
EVENTS_MANY = 6

_PUT, _DELETE = 0, 1

#: Encode with ``use_bin_type`` (bytes stay bytes, str stays str); one packer per process is
#: fine (asyncio is single-threaded, and ``pack`` never suspends).
_packer = msgpack.Packer(use_bin_type=True)
#: :func:`pack` without its Python frame, for the per-request paths.
pack_bound: Callable[[Any], bytes] = _packer.pack


class FrameError(ValueError):
    """A message that is not a sequence of valid frames."""


def pack(frame: list[Any]) -> bytes:
    """The bytes of one frame."""
    data: bytes = _packer.pack(frame)
    return data


#: What :func:`unpack_one` raises for a message that is not exactly one object (several frames
#: included).
NOT_ONE = (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError)


def unpack_one(body: bytes | memoryview, max_len: int) -> Any:
    """The one msgpack object that is the whole of ``body``, with the frames' limits (the
    server's short path for a message of one request; :func:`unpack_all` judges the rest)."""
    return msgpack.unpackb(
        body,
        raw=False,
        strict_map_key=True,
        max_bin_len=max_len,
        max_str_len=max_len,
        max_array_len=1_000_000,
        max_map_len=10_000,
        max_ext_len=0,
    )


def unpack_all(data: bytes | memoryview, *, max_len: int) -> Iterator[list[Any]]:
    """Every frame of one message, in order; raises :class:`FrameError` (after the frames before
    it) on anything but arrays, including a message that ends inside a frame."""
    if not data:
        return
    # The first frame with one call (most messages are one frame: a sequential caller's request
    # and its answer); see unpack_rest for the others.
    rest = b""
    try:
        frame = unpack_one(data, max_len)
    except msgpack.ExtraData as extra:
        frame, rest = extra.unpacked, extra.extra
    except (msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        raise _not_msgpack(exc) from None
    yield _checked(frame)
    if rest:
        yield from unpack_rest(rest, max_len)


def unpack_rest(rest: bytes, max_len: int) -> Iterator[list[Any]]:
    """The frames of a message after its first (``rest``: what :func:`unpack_one` left, its
    ``ExtraData``'s ``extra``), as :func:`unpack_all` yields them.

    A few with one call each (an answer and a watch's events, as a rule): an Unpacker zeroes
    about 40 KB when it is made, more than decoding such a message costs. Past a few (a long
    message: its tail is not copied again for each frame), or at anything not valid (it says
    what, as it always has), an Unpacker takes the rest."""
    for _ in range(_FEW_FRAMES):
        try:
            frame, rest = unpack_one(rest, max_len), b""
        except msgpack.ExtraData as extra:
            frame, rest = extra.unpacked, extra.extra
        except NOT_ONE:
            break
        yield _checked(frame)
        if not rest:
            return
    yield from _unpack_rest(rest, max_len)


#: Frames after a message's first that :func:`unpack_rest` decodes with one call each.
_FEW_FRAMES = 4


def _unpack_rest(data: bytes, max_len: int) -> Iterator[list[Any]]:
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        max_buffer_size=len(data),
        max_bin_len=max_len,
        max_str_len=max_len,
        max_array_len=1_000_000,
        max_map_len=10_000,
        max_ext_len=0,
    )
    unpacker.feed(data)
    end = 0  # where the last whole frame ends (tell() counts a partial one's bytes too)
    try:
        for frame in unpacker:
            end = unpacker.tell()
            yield _checked(frame)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        if isinstance(exc, FrameError):
            raise
        raise _not_msgpack(exc) from None
    if end != len(data):
        raise FrameError("the message is not valid msgpack: it ends inside a frame")


def _not_msgpack(exc: Exception) -> FrameError:
    """The error for msgpack's ``exc``, named by its message (or its type, when it has none)."""
    return FrameError(f"the message is not valid msgpack: {str(exc) or type(exc).__name__}")


def _checked(frame: Any) -> list[Any]:
    if not isinstance(frame, list) or not frame:
        raise FrameError(f"a frame must be a non-empty array, got {type(frame).__name__}")
    return frame


def kv_to_wire(kv: KeyValue) -> list[Any]:
    return [kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease]


def kv_from_wire(item: list[Any]) -> KeyValue:
    key, value, create, mod, version, lease = item
    return new_kv(key, value, create, mod, version, lease)


def range_to_wire(result: RangeResult) -> list[Any]:
    return [result.revision, result.count, result.more, [kv_to_wire(kv) for kv in result.kvs]]


def range_from_wire(item: list[Any]) -> RangeResult:
    revision, count, more, kvs = item
    return RangeResult(
        kvs=tuple(kv_from_wire(kv) for kv in kvs), revision=revision, count=count, more=more
    )


def lease_status_to_wire(status: LeaseStatus) -> list[Any]:
    return [status.id, status.granted_ttl, status.remaining, list(status.keys)]


def lease_status_from_wire(item: list[Any]) -> LeaseStatus:
    lease_id, granted, remaining, keys = item
    return LeaseStatus(lease_id, float(granted), float(remaining), tuple(keys))


def encode_events(events: list[WatchEvent]) -> bytes:
    """The blob of an ``EVENTS`` frame: ``[[kind, key, value, create, mod, version, lease],...]``
    (a DELETE carries its revision as ``mod`` and zeros elsewhere)."""
    blob: bytes = _packer.pack(
        [[_PUT if e.type is EventType.PUT else _DELETE, *kv_to_wire(e.kv)] for e in events]
    )
    return blob


def decode_events(blob: bytes) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    put, delete = EventType.PUT, EventType.DELETE
    for kind, key, value, create, mod, version, lease in msgpack.unpackb(blob, raw=False):
        kv = new_kv(key, value, create, mod, version, lease)
        out.append(new_event(put if kind == _PUT else delete, kv))
    return out
