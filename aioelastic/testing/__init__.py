"""The public test kit.

- here: :class:`VirtualTimeLoop` / :func:`run_virtual` (virtual time) and
  :class:`FaultInjectingStore` (partitions, failing calls, latency);
- ``aioelastic.testing.conformance``: the store conformance suite (needs pytest);
- ``aioelastic.testing.stateful``: the hypothesis state machine for the store protocol;
- ``aioelastic.testing.http`` / ``aioelastic.testing.etcd``: real servers for tests;
- ``aioelastic.testing.pytest_plugin``: fixtures (``aioelastic_memory_store``,
  ``aioelastic_http_server``, ``aioelastic_etcd``, ``aioelastic_etcd_cluster``), loaded
  automatically by pytest once aioelastic is installed.
"""

from __future__ import annotations

from ._virtual_time import VirtualTimeLoop, run_virtual, virtual_time_loop
from .faults import FaultInjectingStore

__all__ = ["FaultInjectingStore", "VirtualTimeLoop", "run_virtual", "virtual_time_loop"]
