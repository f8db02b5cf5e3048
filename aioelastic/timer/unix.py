"""Timers across processes on one host: JSON lines over a Unix-domain socket.

Each line a client sends is a :class:`~aioelastic.timer.TimerRequest` JSON object plus an
``"id"``; the server answers every line with ``{"id": n, "ok": true}`` or
``{"id": n, "error": "..."}``, so ``acquire`` returns only once the timer is armed and a malformed
request gets a clear error (the server logs it and keeps serving). The worker id is the client's
process id, taken from the kernel (``SO_PEERCRED``) rather than trusted from the request: a
client can only arm timers against itself, so a stray writer cannot make the server kill an
arbitrary process (torch's FileTimerServer trusts the pid in the message). Where
``SO_PEERCRED`` is missing (not Linux) the claimed pid is trusted, and the socket file's mode
(0600) is the only guard.

A worker process that exits has its timers dropped: the server watches each worker with a
``pidfd`` (Linux >= 5.3) registered on the event loop; where pidfds are missing it checks the
process when its connection closes, and in any case once more when a timer fires (a zombie
still counts as alive there, and signalling it is harmless). Wire expirations are wall-clock,
converted to loop deadlines on receipt (see :mod:`aioelastic.timer.api`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import TimerError
from ._client import TimerClient
from ._guard import _caller_scope
from ._server import Reaper, TimerServer
from ._table import Armed
from ._wire import TimerRequest, check_duration, check_scope_id, check_signal, wall_clock
from .reapers import SignalReaper

if TYPE_CHECKING:
    from ..events import EventSink

__all__ = ["BlockingUnixTimerClient", "UnixTimerClient", "UnixTimerServer"]

log = logging.getLogger("aioelastic.timer")

#: Longest accepted request line, in bytes.
MAX_LINE = 16 * 1024

_HAVE_PEERCRED = hasattr(socket, "SO_PEERCRED")
_HAVE_PIDFD = hasattr(os, "pidfd_open")


def _peer_pid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None or not _HAVE_PEERCRED:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return pid if pid > 0 else None


class UnixTimerServer(TimerServer):
    """Serves timers to worker processes on this host over the Unix socket at ``path``.

    ``reaper`` defaults to :class:`~aioelastic.timer.SignalReaper` (SIGKILL). ``wall`` is the
    wall clock wire expirations are read against (``time.time``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        reaper: Reaper | None = None,
        *,
        history: int = 1000,
        wall: Callable[[], float] = wall_clock,
        event_sink: EventSink | None = None,
    ) -> None:
        super().__init__(
            reaper if reaper is not None else SignalReaper(),
            history=history,
            event_sink=event_sink,
        )
        self.path = os.fspath(path)
        if not self.path:
            raise ValueError("path must not be empty")
        self._wall = wall
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._pidfds: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"<UnixTimerServer {self.path!r} armed={self.armed}>"

    async def _run(self, ready: Callable[[], None]) -> None:
        await self._claim_path()
        server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
        try:
            os.chmod(self.path, 0o600)
            ready()
            await server.serve_forever()
        finally:
            server.close()
            for writer in list(self._writers):
                writer.close()
            if self._handlers:  # closed connections end their handlers; cancel stragglers
                _done, pending = await asyncio.wait(list(self._handlers), timeout=1.0)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending)
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    async def _claim_path(self) -> None:
        """Remove a stale socket file left by a dead server; refuse to steal a live one."""
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise TimerError(f"{self.path!r} exists and is not a socket")
        try:
            _reader, writer = await asyncio.open_unix_connection(self.path)
        except OSError:
            os.unlink(self.path)
            return
        writer.close()
        raise TimerError(f"another timer server is already listening on {self.path!r}")

    async def _aclose(self) -> None:
        loop = self._loop
        for fd in self._pidfds.values():
            if loop is not None:
                loop.remove_reader(fd)
            os.close(fd)
        self._pidfds.clear()

    # -- one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        peer = _peer_pid(writer)
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than MAX_LINE; the buffer was discarded
                    self._reject("line", f"longer than {MAX_LINE} bytes")
                    await self._reply(writer, None, f"request line longer than {MAX_LINE} bytes")
                    continue
                if not line:
                    break
                if not line.strip():
                    continue
                request_id, error = self._handle_line(line, peer)
                await self._reply(writer, request_id, error)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # the server is closing; end quietly (asyncio's stream callback would log a
            # cancelled handler as an error)
            pass
        finally:
            self._writers.discard(writer)
            self._handlers.discard(task)
            writer.close()
            if peer is not None and not _HAVE_PIDFD:
                self._check_exited(peer)

    async def _reply(
        self, writer: asyncio.StreamWriter, request_id: object, error: str | None
    ) -> None:
        reply: dict[str, object] = {"id": request_id}
        if error is None:
            reply["ok"] = True
        else:
            reply["error"] = error
        writer.write(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
        await writer.drain()

    def _handle_line(self, line: bytes, peer: int | None) -> tuple[object, str | None]:
        """Apply one request; return its id and an error message (None: ok)."""
        request_id: object = None
        try:
            try:
                data = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"a timer request must be JSON: {exc}") from None
            if isinstance(data, dict):
                request_id = data.get("id")
                if request_id is not None and (
                    isinstance(request_id, bool) or not isinstance(request_id, int)
                ):
                    request_id = None
                    raise ValueError("'id' must be an int")
            request = TimerRequest.from_dict(data)
            worker = request.worker_id
            if isinstance(worker, str) or (request.pid is not None and request.pid != worker):
                raise ValueError(f"worker must be the client's process id, got {worker!r}")
            if peer is not None and worker != peer:
                raise ValueError(
                    f"worker {worker} is not the connecting process (pid {peer}); a client can "
                    f"only arm timers for itself"
                )
            if request.expiration_time is None:
                self._disarm(worker, request.scope_id)
            else:
                self._watch_process(worker)
                deadline = self._deadline_from_wall(request.expiration_time, self._wall)
                self._arm(
                    worker,
                    request.scope_id,
                    deadline,
                    expiration_time=request.expiration_time,
                    pid=worker,
                    signal=request.signal,
                )
        except (ValueError, ProcessLookupError, TimerError) as exc:
            message = (
                "the worker process has exited" if isinstance(exc, ProcessLookupError) else str(exc)
            )
            self._reject(line[:200].decode(errors="replace").strip(), message)
            return request_id, message
        return request_id, None

    # -- worker processes

    def _watch_process(self, pid: int) -> None:
        """Drop the worker's timers when its process exits (pidfd readable on the loop)."""
        if not _HAVE_PIDFD or pid in self._pidfds:
            return
        loop = self._loop
        assert loop is not None
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise
        except OSError as exc:  # e.g. an old kernel: fall back to checking at disconnect
            log.debug("pidfd_open(%d) failed: %s", pid, exc)
            return
        self._pidfds[pid] = fd
        loop.add_reader(fd, self._process_exited, pid)

    def _process_exited(self, pid: int) -> None:
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            assert self._loop is not None
            self._loop.remove_reader(fd)
            os.close(fd)
        self._drop_worker(pid, "its process exited")

    def _expire(self, armed: Armed) -> None:
        # The exit of a worker may not have been seen yet (no pidfd, or its event is due in this
        # same loop iteration): a process that no longer exists is dropped, not reaped.
        pid = armed.worker_id
        assert isinstance(pid, int)
        if not self._check_exited(pid):
            super()._expire(armed)

    def _check_exited(self, pid: int) -> bool:
        """Drop the worker's timers if its process is gone; return whether it was."""
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self._drop_worker(pid, "its process exited")
            return True
        except PermissionError:
            pass
        return False


class UnixTimerClient(TimerClient):
    """Acquires and releases this process's timers on a :class:`UnixTimerServer` at ``path``.

    ``signal`` asks the server to reap with that signal instead of its reaper's default.
    Connects on first use (or on ``async with``); every call waits for the server's answer and
    raises :class:`~aioelastic.errors.TimerError` if it refused the request or is unreachable.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        signal: int | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        self.path = os.fspath(path)
        self.signal = check_signal(signal) if signal is not None else None
        self.connect_timeout = connect_timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self.pid = os.getpid()

    async def __aenter__(self) -> UnixTimerClient:
        await self.connect()
        return self

    async def connect(self) -> None:
        """Open the connection (idempotent)."""
        if self._writer is not None:
            return
        try:
            async with asyncio.timeout(self.connect_timeout):
                self._reader, self._writer = await asyncio.open_unix_connection(
                    self.path, limit=MAX_LINE
                )
        except (OSError, TimeoutError) as exc:
            raise TimerError(f"cannot reach the timer server at {self.path!r}: {exc}") from exc

    async def aclose(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _drop_connection(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()

    async def _request(self, request: TimerRequest) -> None:
        async with self._lock:
            if os.getpid() != self.pid:  # forked: the connection belongs to the parent
                self._drop_connection()
                raise TimerError(
                    "this UnixTimerClient was created in another process (before a fork); "
                    "create a new client in this process"
                )
            await self.connect()
            reader, writer = self._reader, self._writer
            assert reader is not None
            assert writer is not None
            self._next_id += 1
            data = request.to_dict()
            data["id"] = self._next_id
            try:
                writer.write(json.dumps(data, separators=(",", ":")).encode() + b"\n")
                await writer.drain()
                line = await reader.readline()
                reply = json.loads(line) if line else None
            except (OSError, ValueError) as exc:
                self._drop_connection()
                raise TimerError(f"lost the timer server at {self.path!r}: {exc}") from exc
            except BaseException:
                self._drop_connection()  # cancelled mid-request: its reply would be out of step
                raise
            if reply is None:
                self._drop_connection()
                raise TimerError(f"the timer server at {self.path!r} closed the connection")
            if not isinstance(reply, dict) or reply.get("id") != self._next_id:
                self._drop_connection()
                raise TimerError(f"unexpected reply from the timer server: {reply!r}")
            if "error" in reply:
                raise TimerError(f"the timer server refused the request: {reply['error']}")

    async def _acquire(self, scope_id: str, after: float) -> None:
        expiration = wall_clock() + after
        await self._request(TimerRequest(self.pid, scope_id, expiration, signal=self.signal))

    async def _release(self, scope_id: str) -> None:
        await self._request(TimerRequest(self.pid, scope_id, None))


class BlockingUnixTimerClient:
    """The same client for code without an event loop (a synchronous training loop).

    ``with client.expires(after=30): train_step()`` arms the scope's timer and releases it when
    the block ends. A synchronous block cannot be interrupted from inside: if it overruns, the
    server reaps the process (SIGKILL by default), as torch's ``expires`` does. Calls block for
    at most ``timeout`` seconds and raise :class:`~aioelastic.errors.TimerError` on failure.
    Not thread-safe: use one client per thread.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, signal: int | None = None, timeout: float = 5.0
    ) -> None:
        self.path = os.fspath(path)
        self.signal = check_signal(signal) if signal is not None else None
        self.timeout = check_duration(timeout, "timeout")
        self.pid = os.getpid()
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._next_id = 0

    def __enter__(self) -> BlockingUnixTimerClient:
        self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the connection (idempotent)."""
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise TimerError(f"cannot reach the timer server at {self.path!r}: {exc}") from exc
        self._sock = sock
        self._buffer = b""

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _after_fork(self) -> None:
        if os.getpid() != self.pid:
            # forked: the connection (and its timers) belong to the parent; this process
            # connects as a worker of its own
            self.pid = os.getpid()
            self._sock = None
            self._buffer = b""

    def acquire(self, scope_id: str, after: float) -> None:
        """Arm the timer of ``scope_id`` to expire ``after`` seconds from now."""
        check_scope_id(scope_id)
        after = check_duration(after)
        self._after_fork()
        self._request(TimerRequest(self.pid, scope_id, wall_clock() + after, signal=self.signal))

    def release(self, scope_id: str) -> None:
        """Disarm the timer of ``scope_id`` (no-op if it is not armed)."""
        check_scope_id(scope_id)
        self._after_fork()
        self._request(TimerRequest(self.pid, scope_id, None))

    @contextlib.contextmanager
    def expires(self, after: float, scope: str | None = None) -> Iterator[None]:
        """Arm ``scope`` (default: the caller's ``file#line``) around a block; release after."""
        scope_id = scope if scope is not None else _caller_scope()
        self.acquire(scope_id, after)
        try:
            yield
        finally:
            self.release(scope_id)

    def _request(self, request: TimerRequest) -> None:
        self.connect()
        sock = self._sock
        assert sock is not None
        self._next_id += 1
        data = request.to_dict()
        data["id"] = self._next_id
        try:
            sock.sendall(json.dumps(data, separators=(",", ":")).encode() + b"\n")
            while b"\n" not in self._buffer:
                chunk = sock.recv(4096)
                if not chunk:
                    self.close()
                    raise TimerError(f"the timer server at {self.path!r} closed the connection")
                self._buffer += chunk
            line, _, self._buffer = self._buffer.partition(b"\n")
            reply = json.loads(line)
        except (OSError, ValueError) as exc:
            self.close()
            raise TimerError(f"lost the timer server at {self.path!r}: {exc}") from exc
        if not isinstance(reply, dict) or reply.get("id") != self._next_id:
            self.close()
            raise TimerError(f"unexpected reply from the timer server: {reply!r}")
        if "error" in reply:
            raise TimerError(f"the timer server refused the request: {reply['error']}")
