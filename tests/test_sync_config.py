"""LeaseConfig validation (Kubernetes leader-election rules), the keeper's renew deadline, and
argument checks of the primitives."""

from __future__ import annotations

import math

import anyio
import pytest

from aioelastic.errors import ConfigError, LeaseExpiredError
from aioelastic.store import LeaseKeeper, MemoryStore
from aioelastic.sync import (
    Barrier,
    Election,
    EventChannel,
    JobStateRecord,
    LeaseConfig,
    Parameters,
    store_lock,
)
from aioelastic.testing import FaultInjectingStore, run_virtual


def test_defaults_are_client_gos() -> None:
    config = LeaseConfig()
    assert (config.ttl, config.renew_deadline, config.retry_period) == (15.0, 10.0, 2.0)


def test_for_ttl_keeps_the_proportions() -> None:
    config = LeaseConfig.for_ttl(3)
    assert config.ttl == 3.0
    assert config.retry_period * 1.2 < config.renew_deadline < config.ttl


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        ({"ttl": 10, "renew_deadline": 10}, "renew_deadline", "less than ttl"),
        ({"ttl": 10, "renew_deadline": 12}, "renew_deadline", "less than ttl"),
        ({"renew_deadline": 2.4, "retry_period": 2}, "renew_deadline", "1.2 \\* retry_period"),
        ({"ttl": 0}, "ttl", "> 0"),
        ({"retry_period": -1}, "retry_period", "> 0"),
        ({"ttl": math.inf}, "ttl", "finite"),
        ({"renew_deadline": math.nan}, "renew_deadline", "finite"),
    ],
)
def test_invalid_combinations_are_rejected(kwargs: dict[str, float], field: str, rule: str) -> None:
    with pytest.raises(ConfigError, match=rule) as info:
        LeaseConfig(**kwargs)
    assert info.value.key == field
    assert isinstance(info.value, ValueError)


def test_non_numbers_are_type_errors() -> None:
    with pytest.raises(TypeError, match="ttl must be a number"):
        LeaseConfig(ttl="15")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retry_period must be a number"):
        LeaseConfig(retry_period=True)


def test_keeper_validates_renew_deadline() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match=r"renew_deadline .* shorter than the ttl"):
        LeaseKeeper(store, 3, renew_deadline=3)
    with pytest.raises(ValueError, match="longer than the keep_alive_interval"):
        LeaseKeeper(store, 3, keep_alive_interval=1, renew_deadline=1)


def test_keeper_gives_up_at_the_renew_deadline_before_the_lease_expires() -> None:
    async def main() -> None:
        store = FaultInjectingStore(MemoryStore())
        async with LeaseKeeper(store, 6, keep_alive_interval=1, renew_deadline=4) as keeper:
            await anyio.sleep(2.5)
            renewed = keeper.statistics().last_renewal
            store.partition()
            error = await keeper.wait_lost()
            lost_at = anyio.current_time()
            store.heal()
            assert "renew deadline" in str(error)
            assert lost_at - renewed == pytest.approx(4, abs=0.05)
            # the store still keeps the lease until the TTL: the holder stopped first
            status = await store.lease_time_to_live(keeper.id)
            assert status.remaining == pytest.approx(2, abs=0.05)

    run_virtual(main)


def test_keeper_treats_a_hanging_renewal_as_failed_at_the_deadline() -> None:
    async def main() -> None:
        store = FaultInjectingStore(MemoryStore())
        async with LeaseKeeper(store, 6, keep_alive_interval=1, renew_deadline=4) as keeper:
            await anyio.sleep(1.5)
            store.latency = 100.0  # every call now hangs
            with anyio.fail_after(5):
                error = await keeper.wait_lost()
            assert "renew deadline" in str(error)
            store.latency = 0.0

    run_virtual(main)


def test_lock_guard_raises_when_the_renew_deadline_passes() -> None:
    async def main() -> None:
        store = FaultInjectingStore(MemoryStore())
        config = LeaseConfig(ttl=3, renew_deadline=2, retry_period=0.5)
        started = 0.0

        async def hold() -> None:
            nonlocal started
            async with store_lock(store, "L", config=config):
                started = anyio.current_time()
                store.partition()
                await anyio.sleep(60)

        with pytest.raises(LeaseExpiredError):
            await hold()
        assert anyio.current_time() - started <= config.renew_deadline + 0.05
        store.heal()

    run_virtual(main)


def test_primitives_check_their_arguments() -> None:
    store = MemoryStore()
    with pytest.raises(TypeError, match="store must be a Store"):
        store_lock("memory://", "L")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        store_lock(store, "")
    with pytest.raises(ValueError, match="not ending in '/'"):
        Election(store, "e/")
    with pytest.raises(TypeError, match="config must be a LeaseConfig"):
        store_lock(store, "L", config={"ttl": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lease must be a LeaseKeeper"):
        store_lock(store, "L", lease=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        store_lock(store, "L", timeout=-1)
    with pytest.raises(ValueError, match="parties must be >= 1"):
        Barrier(store, "B", 0)
    with pytest.raises(TypeError, match="parties must be an int"):
        Barrier(store, "B", 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="schema\\['x'\\] must be a type"):
        Parameters(store, schema={"x": "int"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="prefix must be a non-empty str"):
        EventChannel(store, "")
    with pytest.raises(ValueError, match="key must be a non-empty str"):
        JobStateRecord(store, "")


def test_bad_values_name_what_is_wrong() -> None:
    async def main() -> None:
        async with MemoryStore() as store:
            with pytest.raises(ValueError, match="limit is 65536"):
                await EventChannel(store).publish("big", "x" * 70_000)
            with pytest.raises(TypeError, match="JSON-serialisable"):
                await Parameters(store).set("nan", math.nan)
            with pytest.raises(ValueError, match="state must be one of"):
                await JobStateRecord(store).set("exploded")
            await store.put("job/state", b"{not json")
            with pytest.raises(ValueError, match="'job/state' is not valid JSON"):
                await JobStateRecord(store).get()
            await store.put("params/lr", b'"fast"')
            with pytest.raises(TypeError, match="'lr' must be float, got str"):
                await Parameters(store, schema={"lr": float}).get("lr")
            with pytest.raises(TypeError, match="value must be str or bytes"):
                await Election(store, "E").campaign(3)  # type: ignore[arg-type]

    run_virtual(main)
