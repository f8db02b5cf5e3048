"""``TorchStore.compare_set`` is one transaction (one request on http/etcd), with torch's
semantics, also for an empty expected value."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from aioelastic.store import MemoryStore
from aioelastic.testing.faults import FaultInjectingStore


async def _counted() -> FaultInjectingStore:
    return FaultInjectingStore(MemoryStore())


def test_compare_set_is_one_transaction() -> None:
    from aioelastic.torchrun import TorchStore, _LoopThread

    loop = _LoopThread()
    try:
        counted = loop.run(_counted())
        store = TorchStore(counted, loop)
        assert store.compare_set("k", "", "v1") == b"v1"  # absent + empty expected: set
        assert store.compare_set("k", "nope", "v2") == b"v1"  # mismatch: the current value
        assert store.compare_set("k", "v1", "v2") == b"v2"
        assert store.compare_set("absent", "x", "y") == b"x"  # torch: absent answers expected
        assert dict(counted.calls) == {"txn": 4}  # no read before, no retry loop
        store.set("empty", b"")
        assert store.compare_set("empty", "", "filled") == b"filled"  # an empty value matches
        assert store.compare_set("empty", "", "again") == b"filled"
        assert store.get("empty") == b"filled"
    finally:
        loop.close()
