"""``benchmarks/client_call_cpu.py`` runs end to end (tiny settings; no timing assertions):
every row, socket-free and over loopback, for this checkout and one ``--against``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.timeout(240)
def test_the_client_call_cpu_benchmark_runs() -> None:
    args = ["--ops", "60", "--repeat", "1", "--against", str(ROOT), "--loop", "asyncio"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "client_call_cpu.py"), *args],
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("get conn", "get public", "put core", "txn public", "keep_alive public"):
        assert f"\n{row} (no socket) " in proc.stdout, (row, proc.stdout)
        assert f"\n{row} " in proc.stdout, (row, proc.stdout)
    assert "\nget public, 64 in flight " in proc.stdout
    assert "\nput + watch event public " in proc.stdout
    assert "ratio this/against" in proc.stdout
