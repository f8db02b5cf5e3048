"""Shared helpers of the agent tests: paths, the workers' records, the orphan check."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "agent_worker.py")
PY = sys.executable


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("AIOELASTIC_TIMER_SOCKET", None)
    return env


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
    deadline = time.monotonic() + within
    while (left := _alive_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "out"
    d.mkdir()
    yield d
    _assert_no_orphans(str(d))
