"""``benchmarks/join_cpu.py`` runs end to end (tiny settings; no timing assertions), for this
checkout and one ``--against``; its callback counts are the footprint test's."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.timeout(120)
def test_the_join_cpu_benchmark_runs() -> None:
    args = ["--joins", "8", "--repeat", "1", "--sizes", "1,4", "--against", str(ROOT)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "join_cpu.py"), *args],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| 1 |", "| 4 |"))]
    assert len(rows) == 6, proc.stdout  # two checkouts and a ratio per N
    # a round of one: the same callbacks per join every time, within the footprint test's bound
    assert f"| 1 | {ROOT} | " in proc.stdout
    median, low, high = map(float, re.findall(r"[\d.]+", rows[0].split("|")[4]))
    assert low == median == high <= 5.0, rows[0]


@pytest.mark.timeout(120)
def test_the_join_cpu_benchmark_runs_over_http() -> None:
    args = ["--store", "http", "--joins", "6", "--repeat", "1", "--sizes", "1,2"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "join_cpu.py"), *args],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "store: http" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 2, proc.stdout  # one checkout: a row per N
