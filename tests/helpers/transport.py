"""A transport that records what is written to it (no socket): for the unit tests of the
session's raw transport and of a new connection's intake."""

from __future__ import annotations

from typing import Any

from aioelastic.store.http._frames import unpack_all


class Transport:
    """What a RawSession or a NewConnection is given to write to, recorded."""

    def __init__(self, *, closing: bool = False) -> None:
        self.data = b""
        self.buffer = 0
        self.closing = closing
        self.closed = False
        self.aborted = False
        #: the protocol it was handed to (set_protocol), if any
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.data += bytes(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.data += b"".join(parts)

    def get_write_buffer_size(self) -> int:
        return self.buffer

    def is_closing(self) -> bool:
        return self.closing or self.closed

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def frames(self) -> list[list[Any]]:
        """The frames of every message written, in order."""
        return self.frames_after(0)

    def frames_after(self, skip: int) -> list[list[Any]]:
        """The frames of every message written after the first ``skip`` bytes (an HTTP head)."""
        frames: list[list[Any]] = []
        data = self.data[skip:]
        while data:
            size = int.from_bytes(data[:4], "big")
            frames.extend(unpack_all(data[4 : 4 + size], max_len=1 << 20))
            data = data[4 + size :]
        return frames
