"""Child processes that die with their parent (Linux ``PR_SET_PDEATHSIG``).

Used for the agent's workers and for the members of
:class:`~aioelastic.etcd_server.EtcdServer`, so a parent killed without a chance to clean up
(SIGKILL, a test runner's timeout) leaves no processes behind. Elsewhere the hook does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# resolved in the parent, before any fork: the child only calls it
_PRCTL = _load_prctl()


def _die_with_parent(parent: int, sig: int) -> None:  # pragma: no cover - runs in the child
    """Between fork and exec: have the kernel send ``sig`` to this child when its parent dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def die_with_parent(
    sig: int = signal.SIGKILL, *, main_thread_only: bool = True
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that ties the child's life to this process, or None where it cannot.

    The kernel signals the child when the *thread* that forked it ends, so by default the hook
    is given only when called from the main thread (which ends with the process); elsewhere
    None. ``main_thread_only=False`` gives it anyway (the agent's workers: its loop's thread
    ending is the agent ending).
    """
    if main_thread_only and threading.current_thread() is not threading.main_thread():
        return None
    return functools.partial(_die_with_parent, os.getpid(), sig)
