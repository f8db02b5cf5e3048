"""``benchmarks/scale.py --mode http --kill`` at a tiny size: the timeline of the loss, from the
server's ``TIMELINE`` lines (``benchmarks/_timeline_serve.py``) and the survivors' answers."""

from __future__ import annotations

import json
from pathlib import Path

from aioelastic.store.http._session_server import DEFAULT_SESSION_GRACE
from benchmarks.scale import main as scale_main
from benchmarks.scale import timeline_text
from benchmarks.scale_http import kill_timeline


def test_the_timeline_takes_the_first_of_each_moment_after_the_kill() -> None:
    lines = [
        "TIMELINE detached 99.000000 1\n",  # before the kill: not this loss's
        "some other line\n",
        "TIMELINE detached 100.010000 1\n",
        "TIMELINE revoking 100.260000 1\n",
        "TIMELINE revoked 100.270000 9\n",
        "TIMELINE written 100.400000 9 0.050000\n",
        "TIMELINE revoking 101.000000 1\n",  # a later session's end
    ]
    timeline = kill_timeline(lines, killed=100.0, first=100.3, seen=100.5)
    assert {k: round(v, 6) for k, v in timeline.items()} == {
        "detached": 0.01,
        "revoking": 0.26,
        "revoked": 0.27,
        "written": 0.4,
        "written_count": 9.0,
        "written_cpu": 0.05,
        "first_seen": 0.3,
        "last_seen": 0.5,
    }
    text = timeline_text(timeline)
    assert text.startswith("detached 0.010, revoking 0.260, revoked 0.270, written 0.400, ")
    assert "first_seen 0.300, last_seen 0.500 s (the server wrote 9 connections" in text


def test_an_http_kill_run_times_each_moment_of_the_loss(tmp_path: Path) -> None:
    out = tmp_path / "kill.json"
    argv = ["--mode", "http", "--sizes", "12", "--kill", "--clients", "2", "--json", str(out)]
    assert scale_main(argv) == 0
    data = json.loads(out.read_text())
    assert data["failures"] == {}
    (figures,) = data["runs"]["12"]
    t = figures["kill_timeline"]
    assert t["detached"] <= t["revoking"] <= t["revoked"] <= t["written"]
    assert t["revoking"] - t["detached"] >= DEFAULT_SESSION_GRACE - 0.01  # the session grace
    assert t["revoked"] <= t["first_seen"] <= t["last_seen"]
    assert t["last_seen"] == figures["lost_seen_seconds"]
    assert t["written_count"] == 11  # every survivor's connection, in the one write after it
