"""The test suite's shared helpers (its fixtures are in ``tests/conftest.py``).

- here: paths, a free loopback port, letting ready tasks run, finishing a child process;
- ``helpers.waiting``: waits on events (inotify, pidfds, log records), each with a deadline;
- ``helpers.agent``: the agent tests' worker script, its records, the orphan check;
- ``helpers.http``: an HTTP store server in a subprocess, a self-signed certificate;
- ``helpers.events``: an event sink that keeps what it is given (``ListSink``).

The public kit (``aioelastic.testing``: virtual time, the fault-injecting store, real servers,
the pytest plugin's fixtures) comes first; what is here is for this suite only.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

__all__ = ["PY", "ROOT", "finish", "free_port", "settle", "subprocess_env"]

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def free_port() -> int:
    """A loopback port nothing listens on now (bound and released: another process may take it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def settle(turns: int = 50) -> None:
    """Let every ready task run (virtual time does not advance while work is ready)."""
    for _ in range(turns):
        await asyncio.sleep(0)  # a yield to the loop, not a wait: no time passes


def subprocess_env() -> dict[str, str]:
    """This environment for a child ``python``, with the checkout first on its path and no
    inherited timer socket (a child agent must start its own)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("AIOELASTIC_TIMER_SOCKET", None)
    return env


async def finish(
    proc: asyncio.subprocess.Process, timeout: float, what: str = "the process"
) -> tuple[int, str, str]:
    """Wait for ``proc`` (its return code, stdout, stderr); killed, and the test failed with its
    stderr, if it does not end within ``timeout`` seconds."""
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        stdout, stderr = await proc.communicate()
        raise AssertionError(f"{what} did not finish in {timeout}s:\n{stderr.decode()}") from None
    assert proc.returncode is not None
    return proc.returncode, (stdout or b"").decode(), (stderr or b"").decode()
