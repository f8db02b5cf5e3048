"""``python -m benchmarks.gc_census`` at a tiny size: its census and its round's collections."""

from __future__ import annotations

import re

import pytest

from benchmarks.gc_census import main


def test_the_census_prints_per_participant_counts_and_the_rounds_collections(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--n", "30", "--top", "3"]) == 0
    out = capsys.readouterr().out
    counts = re.search(
        r"idle handler ([\d.]+), waiting member ([\d.]+), kept after the round ([\d.]+)", out
    )
    assert counts is not None, out
    idle, waiting, kept = map(float, counts.groups())
    assert 0 < idle < waiting  # a waiting member holds its join besides the handler
    assert kept > 0
    assert re.search(r"gen0 \d+ \(\d+ ms\), gen1 \d+ \(\d+ ms\), gen2 \d+ \(\d+ ms\)", out), out
    assert "promoted into the oldest generation:" in out
