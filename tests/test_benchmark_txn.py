"""``benchmarks/txn.py`` runs end to end (tiny settings; no timing assertions): its increments
are exact in every mode (the script checks the final count) and it prints every row."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.timeout(120)
def test_the_txn_benchmark_runs() -> None:
    args = ["--repeat", "1", "--increments", "60", "--tasks", "5", "--calls", "4"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "txn.py"), *args],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("cas loop", "cas + lock", "txn add", "stm", "server add", "read + cas", "one txn"):
        assert f"\n{row} " in proc.stdout, (row, proc.stdout)
