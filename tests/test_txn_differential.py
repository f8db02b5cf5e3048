"""Differential test of transactions: the same random transactions (random compares of every
kind, random operations in both branches), mixed with plain writes and leases, on the memory
backend and on a real etcd give identical results, revisions and watch events (modulo etcd's
revision offset and lease ids). etcd is the oracle."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_etcd_differential import KEYS, PREFIXES, Side, apply, lease_ref, run_both

from aioelastic import LeaseNotFoundError
from aioelastic.etcd_server import EtcdServer
from aioelastic.store import (
    Compare,
    Delete,
    DeletePrefix,
    DeleteResult,
    Get,
    GetResult,
    Put,
    PutResult,
    Range,
    RangeResult,
)

pytestmark = pytest.mark.etcd

keys = st.sampled_from(KEYS)
values = st.sampled_from([b"", b"a", b"b", b"ab", b"\xff"])
# an int operand: ("n", small number) as is, ("rev", i) the i-th revision of the run, ("lease",
# ref) a lease id; translated per side. Each target gets the operands of its own kind: a
# revision operand against a version would be translated by etcd's revision offset on one side
# only (version 1 == revision 1 on memory, but not on etcd, whose run starts later).
small = st.tuples(st.just("n"), st.integers(0, 3))
zero = st.tuples(st.just("n"), st.just(0))  # absent: the one revision both sides share
int_operands = {
    "version": small,
    "create_revision": st.one_of(zero, st.tuples(st.just("rev"), st.integers(0, 12))),
    "mod_revision": st.one_of(zero, st.tuples(st.just("rev"), st.integers(0, 12))),
    "lease": st.one_of(zero, st.tuples(st.just("lease"), lease_ref)),
}
ops = st.sampled_from(["==", "!=", "<", ">"])
compares = st.one_of(
    st.tuples(keys, st.just("value"), ops, values),
    *(st.tuples(keys, st.just(target), ops, operand) for target, operand in int_operands.items()),
)
txn_ops = st.one_of(
    st.tuples(st.just("put"), keys, values, lease_ref),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("range"), st.sampled_from(PREFIXES), st.none() | st.integers(1, 3)),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("delete_prefix"), st.sampled_from(["a/", "b", "é", "zz"])),
)
transactions = st.tuples(
    st.just("txn"),
    st.lists(compares, max_size=3),
    st.lists(txn_ops, max_size=4),
    st.lists(txn_ops, max_size=4),
)
steps = st.one_of(
    transactions,
    transactions,
    st.tuples(st.just("put"), keys, st.binary(max_size=3), lease_ref),
    st.tuples(st.just("grant"), st.integers(30, 90)),
    st.tuples(st.just("revoke"), lease_ref),
)


def _operand(side: Side, spec: Any) -> int | bytes:
    if isinstance(spec, bytes):
        return spec
    kind, n = spec
    if kind == "rev":
        return side.base + n if n else 0
    if kind == "lease":
        return side.lease_id(n)
    return int(n)


def _op(side: Side, spec: tuple[Any, ...]) -> Any:
    name = spec[0]
    if name == "put":
        return Put(spec[1], spec[2], side.lease_id(spec[3]))
    if name == "get":
        return Get(spec[1])
    if name == "range":
        return Range(spec[1], spec[2])
    if name == "delete":
        return Delete(spec[1])
    return DeletePrefix(spec[1])


def _result(side: Side, result: Any) -> Any:
    if isinstance(result, PutResult):
        return ("put", side.kv(result.kv), side.kv(result.prev_kv))
    if isinstance(result, GetResult):
        return ("get", side.kv(result.kv))
    if isinstance(result, RangeResult):
        kvs = [side.kv(kv) for kv in result]
        return ("range", kvs, side.rev(result.revision), result.count, result.more)
    assert isinstance(result, DeleteResult)
    return ("delete", result.deleted)


async def apply_step(side: Side, step: tuple[Any, ...]) -> Any:
    if step[0] != "txn":
        return await apply(side, step)
    _, compare_specs, success, failure = step
    try:
        result = await side.store.txn(
            compare=[Compare(k, t, o, _operand(side, v)) for k, t, o, v in compare_specs],
            success=[_op(side, s) for s in success],
            failure=[_op(side, s) for s in failure],
        )
    except (LeaseNotFoundError, ValueError) as exc:
        return type(exc).__name__
    return (result.succeeded, side.rev(result.revision), [_result(side, r) for r in result])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=st.lists(steps, min_size=6, max_size=20))
def test_memory_and_etcd_agree_on_transactions(
    etcd: EtcdServer, plan: list[tuple[Any, ...]]
) -> None:
    asyncio.run(run_both(etcd, plan, apply_step, "txndiff"))
