"""Helpers of the agent tests: the worker script, its records, the processes left behind."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from . import PY, ROOT
from . import subprocess_env as _env
from .waiting import until_exited

__all__ = [
    "PY",
    "ROOT",
    "WORKER",
    "_alive_with",
    "_assert_no_orphans",
    "_env",
    "_lines",
    "_parent_of",
]

WORKER = str(ROOT / "tests" / "agent_worker.py")


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _alive_with(marker: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line mentions ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state = stat.rpartition(")")[2].split()[0]
        if marker in cmdline and state not in ("Z", "X"):
            found.append((int(entry), cmdline))
    return found


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def _assert_no_orphans(marker: str, within: float = 5.0) -> None:
    """No live process mentions ``marker`` once ``within`` seconds have passed (or sooner: it
    returns as soon as those found, and any found after them, have exited)."""
    deadline = time.monotonic() + within
    while (left := _alive_with(marker)) and (wait := deadline - time.monotonic()) > 0:
        until_exited([pid for pid, _ in left], wait)
    assert not left, f"processes left behind: {left}"
