"""Moved to ``helpers.agent`` (and the ``out`` fixture to conftest.py); kept for test modules
written before the move, on branches not merged yet. New code imports from ``helpers``."""

from __future__ import annotations

from conftest import out
from helpers.agent import (
    PY,
    ROOT,
    WORKER,
    _alive_with,
    _assert_no_orphans,
    _env,
    _lines,
    _parent_of,
)

__all__ = [
    "PY",
    "ROOT",
    "WORKER",
    "_alive_with",
    "_assert_no_orphans",
    "_env",
    "_lines",
    "_parent_of",
    "out",
]
