"""The agent's private temporary directory (its timer socket), and the cleanup of those that
SIGKILLed agents left behind.

An agent that dies by SIGKILL cannot remove its ``aioelastic-agent-<pid>-*`` directory, so every
agent, when it starts, removes those of dead agents: a pid that no longer runs and a
``timer.sock`` that no longer accepts a connection (see :mod:`aioelastic._tmpdirs`).
"""

from __future__ import annotations

import errno
import os
import socket

from .. import _tmpdirs

__all__ = ["PREFIX", "clean_stale_dirs", "make_dir"]

PREFIX = "aioelastic-agent-"


def make_dir() -> str:
    """A new private directory named with this process's pid."""
    return _tmpdirs.make_dir(PREFIX)


def _socket_answers(directory: str) -> bool:
    path = os.path.join(directory, "timer.sock")
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError as exc:
            return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    return True


def clean_stale_dirs(directory: str | None = None) -> list[str]:
    """Remove the directories dead agents left in ``directory`` (default: the temp dir)."""
    return _tmpdirs.clean_stale_dirs(PREFIX, _socket_answers, directory)
