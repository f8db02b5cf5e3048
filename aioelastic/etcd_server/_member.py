"""One etcd member's process: its ports and files, starting it, signalling it, waiting for its
exit (through a pidfd on the event loop, so a member started in one loop can be stopped in
another)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .._proc import die_with_parent

__all__ = ["Member", "free_ports", "wait_process"]


def free_ports(host: str, count: int) -> list[int]:
    """``count`` ports free on ``host`` just now (etcd may still lose one to a race: it is
    started again on others then)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


async def wait_process(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc`` to exit without blocking the loop (a pidfd reader; a thread otherwise)."""
    if proc.poll() is not None:
        return proc.returncode
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # pragma: no cover - not Linux >= 5.3
        return await asyncio.to_thread(proc.wait)
    done: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()


@dataclass(eq=False)
class Member:
    index: int
    name: str
    data_dir: Path
    log_path: Path
    client_port: int = 0
    peer_port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self, command: list[str]) -> None:
        """Start the member's process with ``command``, its output appended to its log."""
        if self.log is None:
            self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in terminate()
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop the members
            preexec_fn=die_with_parent(signal.SIGTERM),  # no orphan etcd if we are SIGKILLed
        )

    async def terminate(self, sig: signal.Signals) -> None:
        """Send ``sig`` and wait for the exit (SIGKILL after 10 s); close the log."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
                proc.send_signal(signal.SIGCONT)  # a frozen member acts on SIGTERM only then
            try:
                async with asyncio.timeout(10.0):
                    await wait_process(proc)
            except TimeoutError:
                proc.kill()
                await wait_process(proc)
        if self.log is not None:
            self.log.close()
            self.log = None

    def freeze(self) -> None:
        """SIGSTOP the running member, returning once it has stopped."""
        if not self.running or self.process is None:
            raise RuntimeError(f"etcd member {self.index} is not running")
        self.process.send_signal(signal.SIGSTOP)
        # Return once it has stopped (the signal is delivered asynchronously): a stop is reported
        # to the parent without reaping the child.
        os.waitpid(self.process.pid, os.WUNTRACED)

    def thaw(self) -> None:
        """SIGCONT the member if it is running (frozen or not)."""
        if self.running and self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def log_tail(self, size: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - size))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""
