"""docs/howto/from-torchrun.md's flag table tells the truth: every flag it gives for
``aioelastic run`` exists, every flag it calls *not accepted* is refused, and (with torch
installed) every torchrun flag has a row."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from aioelastic.agent import _cli

PAGE = Path(__file__).resolve().parent.parent / "docs" / "howto" / "from-torchrun.md"


def _rows() -> list[tuple[str, str]]:
    text = PAGE.read_text()
    table = text.split("## Flag by flag", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("torchrun", "---"):
            rows.append((cells[0], cells[1]))
    return rows


def _flags(cell: str) -> list[str]:
    return [f for f in re.findall(r"`([^`]+)`", cell) for f in f.split() if f.startswith("-")]


def _run_options() -> set[str]:
    parser = argparse.ArgumentParser()
    _cli.configure(parser)
    return {o for action in parser._actions for o in action.option_strings}


def test_the_table_has_rows() -> None:
    assert len(_rows()) >= 25


def test_aioelastic_flags_in_the_table_exist_and_refusals_are_real() -> None:
    ours = _run_options()
    for torch_cell, our_cell in _rows():
        if our_cell == "not accepted":
            for flag in _flags(torch_cell):
                assert flag not in ours, f"{flag} is accepted now: update the table"
        else:
            flags = _flags(our_cell)
            assert flags, f"row {torch_cell!r}: no flag named for aioelastic run"
            missing = [f for f in flags if f not in ours]
            assert not missing, f"row {torch_cell!r}: aioelastic run has no {missing}"


def test_every_torchrun_flag_has_a_row() -> None:
    run = pytest.importorskip("torch.distributed.run")
    documented = {f for torch_cell, _ in _rows() for f in _flags(torch_cell)}
    parser = run.get_args_parser()
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        if longs:
            assert set(longs) & documented, f"torchrun's {longs[0]} is not in the table"
