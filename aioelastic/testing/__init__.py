"""The public test kit: virtual time, the store conformance suite, and (soon) fault injection,
hypothesis strategies and pytest fixtures.

``aioelastic.testing.conformance`` needs pytest; import it from test code only.
"""

from __future__ import annotations

from ._virtual_time import VirtualTimeLoop, run_virtual, virtual_time_loop
from .faults import FaultInjectingStore

__all__ = ["FaultInjectingStore", "VirtualTimeLoop", "run_virtual", "virtual_time_loop"]
