"""The store state machine against a real etcd: random operation sequences, each step checked
against the reference model that the memory backend also passes (etcd is the oracle: if they
disagree, the model and the memory backend are wrong)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from aioelastic.etcd_server import EtcdServer
from aioelastic.store import Store
from aioelastic.testing.etcd import running_etcd
from aioelastic.testing.stateful import StoreMachine

pytestmark = pytest.mark.etcd

_server: EtcdServer | None = None


@pytest.fixture(scope="module", autouse=True)
def etcd() -> Iterator[EtcdServer]:
    global _server
    with running_etcd() as server:
        _server = server
        try:
            yield server
        finally:
            _server = None


class EtcdMachine(StoreMachine):
    async def open_store(self) -> Store:
        from aioelastic.store.etcd import EtcdStore

        assert _server is not None
        store = EtcdStore(_server.endpoints)
        self._etcd_store = store
        return store.namespace(f"stateful/{uuid.uuid4().hex}/")

    def teardown(self) -> None:
        # Revoke what the example left behind, so no lease expires during a later example (the
        # revision is global: a stray expiry would shift every revision the next one checks).
        store: Store | None = getattr(self, "_etcd_store", None)
        try:
            if store is not None:
                model = getattr(self, "model", None)
                for lease_id in list(model.leases) if model is not None else []:
                    self.run(store.lease_revoke(lease_id))
                if model is not None:
                    model.leases.clear()  # revoked: the base teardown must not revoke them again
                if self.watch is not None:
                    self.run(self.watch.aclose())
                    self.watch = None
                self.run(store.aclose())
        finally:
            super().teardown()  # closes the namespace view and the loop


EtcdMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEtcdStateful = EtcdMachine.TestCase
