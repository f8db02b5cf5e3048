"""Waiting for what another process or task does, on events, each wait with a deadline.

- :func:`until_file` / :func:`until_file_sync`: a condition on the files of a directory that
  another process writes (the agent's workers' records), re-checked when inotify reports a change
  in that directory, never on a timer;
- :func:`until_exited`: processes (not necessarily our children) have exited, on pidfds;
- :func:`until_logged`: a log record containing some text was emitted (a handler sets an event);
- :func:`eventually`: the one poll, for state that announces no change (a server's statistics):
  wherever the code under test offers an event, wait on that instead.

A wait that runs out raises ``AssertionError`` with the message it was given, as the
``assert time.monotonic() < deadline, ...`` loops these replace did.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import select
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

__all__ = [
    "DirectoryWatch",
    "eventually",
    "until_exited",
    "until_file",
    "until_file_sync",
    "until_logged",
]

T = TypeVar("T")

# <sys/inotify.h>: a file in the directory was created, written, closed after writing, moved in,
# or deleted; IN_NONBLOCK and IN_CLOEXEC are O_NONBLOCK and O_CLOEXEC.
_IN_EVENTS = 0x2 | 0x8 | 0x80 | 0x100 | 0x200
_IN_FLAGS = os.O_NONBLOCK | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)


class DirectoryWatch:
    """An inotify descriptor on one directory: readable when a file in it changes."""

    def __init__(self, directory: Path) -> None:
        fd: int = _libc.inotify_init1(_IN_FLAGS)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if _libc.inotify_add_watch(fd, os.fsencode(directory), _IN_EVENTS) < 0:
            code = ctypes.get_errno()
            os.close(fd)
            raise OSError(code, f"inotify_add_watch({directory}) failed")
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def drain(self) -> None:
        """Read the pending change records (they only say "look again")."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 65536):
                pass

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def until_file(directory: Path, check: Callable[[], T | None], within: float, what: str) -> T:
    """``check()``'s first truthy result, re-checked on every change in ``directory``."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()
    with DirectoryWatch(directory) as watch:  # watching before the first check: no change lost
        loop.add_reader(watch.fd, changed.set)
        try:
            async with asyncio.timeout(within):
                while not (result := check()):
                    await changed.wait()
                    changed.clear()
                    watch.drain()
                return result
        except TimeoutError:
            raise AssertionError(what) from None
        finally:
            loop.remove_reader(watch.fd)


def until_file_sync(directory: Path, check: Callable[[], T | None], within: float, what: str) -> T:
    """:func:`until_file` for a plain (blocking) test."""
    deadline = time.monotonic() + within
    with DirectoryWatch(directory) as watch:
        while not (result := check()):
            left = deadline - time.monotonic()
            assert left > 0, what
            select.select([watch.fd], [], [], left)
            watch.drain()
        return result


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # gone already


def until_exited(pids: list[int], within: float) -> None:
    """Return when every process in ``pids`` has exited (as a zombie counts), or ``within``
    seconds have passed (the caller then finds what is left)."""
    fds = [fd for fd in map(_pidfd, pids) if fd is not None]
    deadline = time.monotonic() + within
    try:
        waiting = list(fds)
        while waiting and (left := deadline - time.monotonic()) > 0:
            try:
                ready, _, _ = select.select(waiting, [], [], left)
            except InterruptedError:  # pragma: no cover - select retries on EINTR since 3.5
                continue
            waiting = [fd for fd in waiting if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


class _Seen(logging.Handler):
    def __init__(self, text: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.text, self.loop, self.event = text, loop, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.loop.call_soon_threadsafe(self.event.set)


@contextlib.asynccontextmanager
async def until_logged(
    logger: str, text: str, within: float, what: Callable[[], str]
) -> AsyncIterator[None]:
    """``async with until_logged(...): start()``: on leaving the block, wait until a record of
    ``logger`` (or a child) containing ``text`` was emitted, from the start of the block on."""
    seen = _Seen(text, asyncio.get_running_loop())
    target = logging.getLogger(logger)
    target.addHandler(seen)
    try:
        yield
        try:
            await asyncio.wait_for(seen.event.wait(), within)
        except TimeoutError:
            raise AssertionError(what()) from None
    finally:
        target.removeHandler(seen)


async def eventually(check: Callable[[], bool], within: float, what: str) -> None:
    """Return once ``check()`` is true, looking every 10 ms: only for state that has no event
    to wait on (counters in ``statistics()``); the test fails with ``what`` after ``within``."""
    try:
        async with asyncio.timeout(within):
            while not check():  # noqa: ASYNC110 - the state polled announces no change
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(what) from None
