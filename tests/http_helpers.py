"""Moved to ``helpers.http``; kept for test modules written before the move, on branches not
merged yet. New code imports from ``helpers.http``."""

from __future__ import annotations

from helpers.http import ROOT, ServerProcess, ServerThread, self_signed_cert

__all__ = ["ROOT", "ServerProcess", "ServerThread", "self_signed_cert"]
