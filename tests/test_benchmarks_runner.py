"""The benchmark runner (``python -m benchmarks``): a tiny real run, and its report helpers.

No timing assertions: the figures only have to be positive numbers in the documented shape.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from benchmarks.run import GROUPS, Row, main, markdown, parse_args


def _check_summary(summary: dict[str, object], n: int) -> None:
    values = summary["values"]
    assert isinstance(values, list)
    assert len(values) == n == summary["n"]
    assert all(isinstance(v, float) and v > 0 for v in values), values
    assert summary["min"] == min(values)
    assert summary["max"] == max(values)
    median = summary["median"]
    assert isinstance(median, float)
    assert min(values) <= median <= max(values)


@pytest.mark.timeout(60)
def test_quick_store_run_writes_json_and_table(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            "store",
            "--no-torch",
            "--repeat",
            "2",
            "--json",
            str(out),
            "--plots",
            str(tmp_path / "plots"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["schema"] == 1
    assert result["groups"] == ["store"]
    assert result["failed"] == []
    assert result["complete"] is True
    assert result["repeat"] == 2
    assert result["torch"] == {"used": False, "why_not": "--no-torch"}
    date = datetime.datetime.fromisoformat(result["date"])
    assert date.tzinfo is not None
    machine = result["machine"]
    assert machine["cores"] >= 1
    assert machine["python"] == ".".join(map(str, sys.version_info[:3]))
    assert len(machine["load_average_start"]) == 3
    assert "store" in result["settings"]
    rows = result["rows"]
    assert [r["key"] for r in rows] == ["store-put", "store-get", "store-concurrent"]
    for row in rows:
        assert row["group"] == "store"
        assert row["unit"] == "ops/s"
        assert row["better"] == "higher"
        assert row["reference"] is None  # --no-torch
        assert row["speedup"] is None
        _check_summary(row["ours"], 2)
    table = Path(result["markdown"]).read_text()
    assert table == proc.stdout
    assert "| 1 client, sequential put (set) |" in table
    assert "Store operations" in table
    head = Path(result["headline"]).read_text()
    assert head.startswith("Measured ")
    assert "| Store operations: 1 client, sequential get |" in head
    # --from-json rewrites the same tables from the JSON, measuring nothing
    again = tmp_path / "again"
    assert main(["--from-json", str(out), "--plots", str(again)]) == 0
    assert (again / "results.md").read_text().splitlines()[1:] == table.splitlines()[1:]


def test_speedup_follows_which_way_is_better() -> None:
    faster = Row("x", "k", "l", "ms", "lower", [1.0, 2.0, 3.0], "ours", "torch", [10.0, 20.0])
    assert faster.speedup() == pytest.approx(15.0 / 2.0)
    throughput = Row("x", "k", "l", "ops/s", "higher", [100.0], "ours", "torch", [400.0])
    assert throughput.speedup() == pytest.approx(0.25)
    alone = Row("x", "k", "l", "ms", "lower", [1.0], "ours")
    assert alone.speedup() is None
    out = faster.to_json()
    assert out["reference"]["median"] == 15.0
    assert out["ours"]["min"] == 1.0


def test_markdown_names_the_winner_and_the_skipped() -> None:
    rows = [
        Row("timers", "a", "p50", "ms", "lower", [1.0], "ours", "torch", [50.0]),
        Row("store", "b", "put", "ops/s", "higher", [100.0], "ours", "torch", [400.0]),
    ]
    text = markdown(rows, [{"group": "rendezvous", "what": "torch N=128", "why": "budget"}], "H")
    assert "**50.0x faster**" in text
    assert "4.0x slower" in text
    assert "- rendezvous: torch N=128: budget" in text
    assert text.index("reap lateness") < text.index("Store operations")


def test_only_rejects_unknown_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--only", "store,nope"])
    assert "nope" in capsys.readouterr().err
    assert parse_args([]).only == list(GROUPS)
