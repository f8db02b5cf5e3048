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


# a value for each refused flag that torchrun itself would accept
_REFUSED_VALUES = {
    "--duplicate-stdout-filters": "error",
    "--duplicate-stderr-filters": "error",
    "--logs-specs": "custom",
    "--numa-binding": "node",
}


def _refusal(flag: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from aioelastic import cli

    capsys.readouterr()
    code = cli.main(["run", flag, _REFUSED_VALUES[flag], "train.py"])
    return code, capsys.readouterr().err


def test_aioelastic_flags_in_the_table_exist_and_refusals_are_real(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ours = _run_options()
    refused = 0
    for torch_cell, our_cell in _rows():
        if our_cell == "refused":
            for flag in _flags(torch_cell):
                refused += 1
                assert flag in ours, f"{flag}: torchrun's flag must parse, then be refused"
                code, err = _refusal(flag, capsys)
                assert code == 2, f"{flag} was not refused: update the table"
                assert f"error: {flag}: " in err, err
                assert "usage: aioelastic run" in err
                assert "starting" not in err
        else:
            flags = _flags(our_cell)
            assert flags, f"row {torch_cell!r}: no flag named for aioelastic run"
            missing = [f for f in flags if f not in ours]
            assert not missing, f"row {torch_cell!r}: aioelastic run has no {missing}"
    assert refused == len(_REFUSED_VALUES)


def test_every_torchrun_flag_has_a_row() -> None:
    run = pytest.importorskip("torch.distributed.run")
    documented = {f for torch_cell, _ in _rows() for f in _flags(torch_cell)}
    parser = run.get_args_parser()
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        if longs:
            assert set(longs) & documented, f"torchrun's {longs[0]} is not in the table"


def test_every_torchrun_flag_parses_and_reads_the_same_environment_variable() -> None:
    """torch.distributed.run's own parser against ours: a flag torch adds fails here by name."""
    run = pytest.importorskip("torch.distributed.run")
    parser = argparse.ArgumentParser()
    _cli.configure(parser)
    ours = {o: action for action in parser._actions for o in action.option_strings}
    missing, other_env = [], []
    for action in run.get_args_parser()._actions:
        for option in action.option_strings:
            if option in ("-h", "--help"):
                continue
            mine = ours.get(option)
            if mine is None:
                missing.append(option)
            elif mine.dest != action.dest and action.dest != "shutdown_timeout":
                # --shutdown-timeout is --stop-timeout's alias, which also reads its variable
                env = f"PET_{action.dest.upper()} vs PET_{mine.dest.upper()}"
                other_env.append(f"{option}: {env}")
    assert not missing, f"torchrun flags aioelastic run does not accept: {missing}"
    assert not other_env, f"read from another variable than torchrun's: {other_env}"
