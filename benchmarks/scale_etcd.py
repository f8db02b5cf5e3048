"""The etcd mode of ``benchmarks/scale.py``: a 3-member etcd cluster (:class:`EtcdServer`), N
handlers spread over client processes, a shared wall-clock t0.

The client processes are the http mode's (``benchmarks/scale_http.py``, given an ``etcd://``
URL): one store per handler, READY, t0 on stdin, ``DONE <last return> <ranks>``. Each size
gets a fresh cluster. Besides t(N), each round prints what it cost, from the members' own
Prometheus counters (summed over the three, read before t0 and after the last return): the
gRPC requests and streams started per join by method, stream messages received (watch creates,
lease keep-alives), watch events sent, raft entries, bytes in and out, etcd's signs of a cluster
at its limits; the members' CPU time and RSS, and the client processes' CPU time over the same
span (on a 2-core machine members and clients share the cores: the sum of the two against the
wall time says how many cores the round got).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass

from aioelastic.etcd_server import EtcdServer
from aioelastic.store import open_store
from benchmarks.scale import RoundFigures
from benchmarks.scale_http import _check, _proc_cpu_rss, _record_sizes, _spawn

MEMBERS = 3
#: the streaming methods (their messages are counted apart from the streams started)
STREAMS = frozenset({"Watch", "LeaseKeepAlive"})

_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")
#: the counters read from every member (name -> the label that splits it, or "")
_COUNTERS = {
    "grpc_server_started_total": "grpc_method",
    "grpc_server_msg_received_total": "grpc_method",
    "etcd_debugging_mvcc_events_total": "",
    "etcd_server_proposals_committed_total": "",
    "etcd_network_client_grpc_sent_bytes_total": "",
    "etcd_network_client_grpc_received_bytes_total": "",
    # signs of a cluster at its limits: applies over 100 ms, linearizable reads that waited
    # for their read index, elections
    "etcd_server_slow_apply_total": "",
    "etcd_server_slow_read_indexes_total": "",
    "etcd_server_leader_changes_seen_total": "",
    "etcd_server_heartbeat_send_failures_total": "",
}
#: the counters of the limits line
LIMITS = {
    "etcd_server_slow_apply_total": "applies over 100 ms",
    "etcd_server_slow_read_indexes_total": "slow read indexes",
    "etcd_server_leader_changes_seen_total": "leader changes seen",
    "etcd_server_heartbeat_send_failures_total": "heartbeat send failures",
}


def scrape(url: str) -> Counter[str]:
    """The counters of :data:`_COUNTERS` at a member's ``/metrics`` (``name`` or
    ``name:method``)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found: Counter[str] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in _COUNTERS:
            continue
        name, labels, value = match.groups()
        split = _COUNTERS[name]
        if split:
            label = re.search(rf'{split}="([^"]*)"', labels or "")
            name = f"{name}:{label.group(1) if label else '?'}"
        found[name] += int(float(value))
    return found


def scrape_all(server: EtcdServer) -> Counter[str]:
    total: Counter[str] = Counter()
    for url in server.metrics_urls:
        total.update(scrape(url))
    return total


@dataclass(frozen=True, slots=True)
class EtcdCosts:
    """What one round cost the cluster and the clients (see the module doc)."""

    n: int
    seconds: float
    counters: dict[str, int]  # summed over the members, after - before
    member_cpu: tuple[float, ...]
    member_rss: tuple[int, ...]
    client_cpu: float
    leader: int  # the index of the member that led (the clients all talk to member 0)

    def per_join(self, name: str) -> float:
        return self.counters.get(name, 0) / self.n

    def report(self) -> str:
        n, member_cpu = self.n, sum(self.member_cpu)
        per = self.per_join
        return "\n".join(
            [
                f"N={n}: t {self.seconds:.2f} s; member CPU {member_cpu:.2f} s "
                f"({' + '.join(f'{x:.2f}' for x in self.member_cpu)}, "
                f"{member_cpu / n * 1e6:.0f} us per join); client processes' CPU "
                f"{self.client_cpu:.2f} s ({self.client_cpu / n * 1e6:.0f} us per join); "
                f"(members + clients) / wall {(member_cpu + self.client_cpu) / self.seconds:.2f}"
                " cores",
                f"  member RSS {' / '.join(f'{r / 2**20:.0f}' for r in self.member_rss)} MiB; "
                f"member {self.leader} led",
                f"  per join: requests and streams started: {self._by_method('started')}",
                f"  per join: messages on streams: {self._by_method('msg_received', STREAMS)}",
                f"  per join: watch events sent {per('etcd_debugging_mvcc_events_total'):.2f}, "
                f"raft entries {per('etcd_server_proposals_committed_total') / MEMBERS:.2f}, "
                f"bytes sent {per('etcd_network_client_grpc_sent_bytes_total'):,.0f}, "
                f"received {per('etcd_network_client_grpc_received_bytes_total'):,.0f}",
                "  limits (summed over the members): "
                + ", ".join(f"{label} {self.counters.get(k, 0)}" for k, label in LIMITS.items()),
            ]
        )

    def _by_method(self, counter: str, only: frozenset[str] | None = None) -> str:
        prefix = f"grpc_server_{counter}_total:"
        found = {
            k[len(prefix) :]: v
            for k, v in self.counters.items()
            if k.startswith(prefix) and (only is None or k[len(prefix) :] in only)
        }
        return ", ".join(f"{m} {v / self.n:.2f}" for m, v in sorted(found.items())) or "-"


async def _revision(url: str) -> int:
    """The cluster's current revision."""
    async with await open_store(url) as store:
        return (await store.range("aioelastic/", limit=1)).revision


def _counts(n: int, clients: int) -> list[int]:
    return [c for i in range(clients) if (c := n // clients + (1 if i < n % clients else 0))]


def run_etcd(n: int, clients: int) -> tuple[RoundFigures, EtcdCosts]:
    """One round of N over a fresh 3-member cluster, the handlers spread over ``clients``."""
    server = EtcdServer(MEMBERS, metrics=True)
    asyncio.run(server.start())
    try:
        return _round(server, n, clients)
    finally:
        asyncio.run(server.aclose())


def _round(server: EtcdServer, n: int, clients: int) -> tuple[RoundFigures, EtcdCosts]:
    run_id = f"scale-{uuid.uuid4().hex[:8]}"
    leader = asyncio.run(server.leader())
    pids = [pid for pid in server.pids if pid is not None]
    procs = _spawn(server.url, run_id, n, _counts(n, clients), "all")
    try:
        for proc in procs:
            proc.answer("READY")
        before = scrape_all(server)
        revision = asyncio.run(_revision(server.url))
        members_before = [_proc_cpu_rss(pid)[0] for pid in pids]
        clients_before = sum(_proc_cpu_rss(p.proc.pid)[0] for p in procs)
        t0 = time.time() + 0.5
        for proc in procs:
            proc.tell(f"{t0}\n")
        answers = [proc.answer("DONE") for proc in procs]
        clients_after = sum(_proc_cpu_rss(p.proc.pid)[0] for p in procs)
        members_after = [_proc_cpu_rss(pid) for pid in pids]
        after = scrape_all(server)
        writes = asyncio.run(_revision(server.url)) - revision
        record_bytes, state_bytes, _ = asyncio.run(_record_sizes(server.url, run_id))
        for proc in procs:
            proc.tell("go\n")
        for proc in procs:
            proc.proc.wait(timeout=120)
    finally:
        for proc in procs:
            proc.stop()
            for pipe in (proc.proc.stdin, proc.proc.stdout):
                if pipe is not None:
                    pipe.close()
    _check(answers, n, [], "the round")
    seconds = max(float(a["at"]) for a in answers) - t0
    after.subtract(before)
    member_cpu = tuple(a[0] - b for a, b in zip(members_after, members_before, strict=True))
    costs = EtcdCosts(
        n=n,
        seconds=seconds,
        counters={k: v for k, v in after.items() if v},
        member_cpu=member_cpu,
        member_rss=tuple(a[1] for a in members_after),
        client_cpu=clients_after - clients_before,
        leader=leader,
    )
    figures = RoundFigures(
        n=n,
        seconds=seconds,
        cpu_seconds=sum(member_cpu),  # the members'
        events=after["etcd_debugging_mvcc_events_total"],
        writes=writes,
        watcher_visits=None,
        keys_scanned=None,
        record_bytes=record_bytes,
        state_bytes=state_bytes,
        server_rss_bytes=max(costs.member_rss),
    )
    return figures, costs


def measure(n: int, clients: int, repeat: int, failures: dict[int, str]) -> list[RoundFigures]:
    """``repeat`` rounds of N (each on a fresh cluster), each one's costs printed as it ends."""
    figures = []
    for _ in range(repeat):
        try:
            round_figures, costs = run_etcd(n, clients)
        except (RuntimeError, AssertionError, OSError, TimeoutError) as exc:  # reported
            failures[n] = str(exc)
            print(f"etcd: N={n} failed: {exc}", file=sys.stderr, flush=True)
            break
        print(costs.report(), flush=True)
        figures.append(round_figures)
    return figures
