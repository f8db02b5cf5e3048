"""``benchmarks/scale.py --mode etcd`` at a tiny size: a 3-member cluster forms, the client
processes run their handlers, every rank comes back once, and the cost report reads the members'
counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aioelastic.testing.etcd import running_etcd

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

pytest.importorskip("grpc")


def test_the_etcd_mode_runs_a_round_and_reports_what_it_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_etcd():  # skips (or fails, in CI) without an etcd binary
        pass
    from benchmarks.scale import main as scale_main

    out = tmp_path / "scale.json"
    argv = ["--mode", "etcd", "--sizes", "6", "--clients", "2", "--json", str(out)]
    assert scale_main(argv) == 0
    data = json.loads(out.read_text())
    assert data["failures"] == {}
    (figures,) = data["runs"]["6"]
    assert figures["seconds"] > 0
    assert figures["cpu_seconds"] > 0  # the members'
    assert figures["events"] >= 6  # the round record, at least, reached every handler
    assert figures["writes"] >= 6 + 1  # the registrations (one with the driver claim), the round
    assert figures["server_rss_bytes"] > 0
    printed = capsys.readouterr().out
    assert "member CPU" in printed
    assert "LeaseGrant 1.00" in printed  # one lease per handler
    assert "Watch 1." in printed  # a watch stream per handler, at least
    assert "leader changes seen 0" in printed
