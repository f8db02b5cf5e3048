"""The public test kit.

- here: :class:`VirtualTimeLoop` / :func:`run_virtual` / :func:`virtual_test` (virtual time),
  :class:`FaultInjectingStore` and :class:`FaultPlan` (latency, failing and hanging calls,
  dropped watch streams, forced lease expiry, partitions between named clients; deterministic
  under a seed);
- ``aioelastic.testing.strategies``: hypothesis strategies for store operations and rendezvous
  scenarios (needs hypothesis);
- ``aioelastic.testing.stateful``: the hypothesis state machine for the store protocol;
- ``aioelastic.testing.rendezvous_machine``: the hypothesis state machine for the rendezvous;
- ``aioelastic.testing.conformance``: the store conformance suite (needs pytest);
- ``aioelastic.testing.sync_conformance``: the coordination-primitives suite (needs pytest);
- ``aioelastic.testing.http`` / ``aioelastic.testing.etcd``: real servers for tests;
- ``aioelastic.testing.pytest_plugin``: fixtures (``aioelastic_memory_store``,
  ``aioelastic_http_server``, ``aioelastic_etcd``, ``aioelastic_etcd_cluster``), loaded
  automatically by pytest once aioelastic is installed.
"""

from __future__ import annotations

from .._public import publish as _publish
from ._virtual_time import VirtualTimeLoop, run_virtual, virtual_test, virtual_time_loop
from .faults import FaultInjectingStore, FaultPlan, InjectedFault

__all__ = [
    "FaultInjectingStore",
    "FaultPlan",
    "InjectedFault",
    "VirtualTimeLoop",
    "run_virtual",
    "virtual_test",
    "virtual_time_loop",
]

_publish(globals())
