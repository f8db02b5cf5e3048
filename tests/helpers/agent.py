"""Helpers of the agent tests: the worker script, its records, the processes left behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import PY, ROOT
from . import subprocess_env as _env
from .waiting import until_exited, until_file, until_file_sync

__all__ = [
    "PY",
    "ROOT",
    "WORKER",
    "_alive_with",
    "_assert_no_orphans",
    "_env",
    "_lines",
    "_parent_of",
    "run_agent",
    "wait_records",
    "wait_records_sync",
]

WORKER = str(ROOT / "tests" / "agent_worker.py")
Records = list[dict[str, Any]]


def run_agent(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m aioelastic run ARGS`` to its end (``env`` over :func:`subprocess_env`'s)."""
    return subprocess.run(
        [PY, "-m", "aioelastic", "run", *args],
        env={**_env(), **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _enough(path: Path, n: int, match: dict[str, str]) -> Callable[[], Records | None]:
    def check() -> Records | None:
        lines = [x for x in _lines(path) if all(x.get(k) == v for k, v in match.items())]
        return lines if len(lines) >= n else None

    return check


def _failed(path: Path, n: int, within: float, what: str, match: dict[str, str]) -> str:
    which = f" with {match}" if match else ""
    return f"{what}: fewer than {n} records{which} in {path} after {within}s"


async def wait_records(path: Path, n: int, within: float, what: str, **match: str) -> Records:
    """The records of ``path`` once it holds ``n`` (those whose fields equal ``match``),
    re-read when its directory changes (the workers write it); the test fails with ``what``
    after ``within`` seconds."""
    failed = _failed(path, n, within, what, match)
    return await until_file(path.parent, _enough(path, n, match), within, failed)


def wait_records_sync(path: Path, n: int, within: float, what: str, **match: str) -> Records:
    """:func:`wait_records` for a plain (blocking) test."""
    failed = _failed(path, n, within, what, match)
    return until_file_sync(path.parent, _enough(path, n, match), within, failed)


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
