"""The job state record: pending, running, succeeded or failed (with a reason), kept in one key
that the agent maintains and every worker can read, await or follow.

Transitions are checked and applied by compare-and-swap, so two writers cannot both move the job
out of a state: ``pending -> running | succeeded | failed``, ``running -> pending (a restart) |
succeeded | failed``; ``succeeded`` and ``failed`` are final.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

import anyio
from anyio.abc import AsyncResource

from ..errors import JobStateError, SyncTimeoutError
from ..store import EventType, KeyValue, Store
from ._common import (
    JSONValue,
    ResumingWatch,
    check_name,
    check_timeout,
    decode_json,
    encode_json,
)

__all__ = ["JobState", "JobStateRecord", "JobStateWatch", "JobStatus"]


class JobState(enum.Enum):
    """The states of a job."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def final(self) -> bool:
        """Whether the job can no longer leave this state."""
        return self in (JobState.SUCCEEDED, JobState.FAILED)


_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.PENDING, JobState.SUCCEEDED, JobState.FAILED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A snapshot of the job state record.

    ``reason``: why (required for ``failed``); ``details``: optional JSON (exit codes, the
    failing rank, ...); ``revision``: the store revision of the write (0: never written, which
    reads as ``pending``).
    """

    state: JobState
    reason: str | None = None
    details: JSONValue = None
    revision: int = 0


class JobStateRecord:
    """The job state at ``key`` in ``store`` (default ``"job/state"``)."""

    def __init__(self, store: Store, key: str = "job/state") -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self.store = store
        self.key = check_name(key, "key")

    def __repr__(self) -> str:
        return f"<JobStateRecord {self.key!r}>"

    def _status(self, kv: KeyValue | None) -> JobStatus:
        if kv is None:
            return JobStatus(JobState.PENDING)
        data = decode_json(kv.value, f"the job state at {self.key!r}")
        try:
            state = JobState(data["state"])
            reason = data.get("reason")
            if reason is not None and not isinstance(reason, str):
                raise TypeError("reason is not a string")
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(
                f"the job state at {self.key!r} is malformed: {data!r:.80} ({exc})"
            ) from None
        return JobStatus(state, reason, data.get("details"), kv.mod_revision)

    async def get(self) -> JobStatus:
        """The current state (``pending`` at revision 0 if it was never written)."""
        return self._status(await self.store.get(self.key))

    async def set(
        self, state: JobState | str, reason: str | None = None, *, details: JSONValue = None
    ) -> JobStatus:
        """Move the job to ``state``; return the new status.

        Raises :class:`~aioelastic.errors.JobStateError` for a transition the state machine
        forbids (e.g. out of ``succeeded``), and ``ValueError`` for ``failed`` without a reason.
        Setting the current state again updates its reason and details.
        """
        try:
            target = JobState(state)
        except ValueError:
            names = [s.value for s in JobState]
            raise ValueError(f"state must be one of {names}, got {state!r}") from None
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a str or None, got {type(reason).__name__}")
        if target is JobState.FAILED and not reason:
            raise ValueError("a failed job needs a reason (reason='...')")
        record: dict[str, JSONValue] = {"state": target.value}
        if reason is not None:
            record["reason"] = reason
        if details is not None:
            record["details"] = details
        data = encode_json(record, "the job state")
        kv = await self.store.get(self.key)
        while True:
            current = self._status(kv)
            if target is not current.state and target not in _ALLOWED[current.state]:
                raise JobStateError(
                    f"the job at {self.key!r} cannot go from {current.state.value} to "
                    f"{target.value}"
                    + (f" (it {current.state.value}: {current.reason})" if current.reason else "")
                )
            if current.state.final and target is current.state:
                raise JobStateError(f"the job at {self.key!r} is already {target.value}")
            expected = 0 if kv is None else kv.mod_revision
            result = await self.store.compare_and_swap(self.key, expected, data)
            if result.succeeded:
                return self._status(result.kv)
            kv = result.kv  # someone else moved it: check the transition again

    async def wait(
        self, states: JobState | str | Iterable[JobState | str], *, timeout: float | None = None
    ) -> JobStatus:
        """Wait until the job is in one of ``states``; return that status.

        Raises :class:`~aioelastic.errors.SyncTimeoutError` after ``timeout`` seconds.
        """
        if isinstance(states, (JobState, str)):
            states = [states]
        wanted = frozenset(JobState(s) for s in states)
        if not wanted:
            raise ValueError("states must name at least one state")
        timeout = check_timeout(timeout)
        with anyio.move_on_after(timeout):
            async with self.watch() as statuses:
                async for status in statuses:
                    if status.state in wanted:
                        return status
        names = sorted(s.value for s in wanted)
        raise SyncTimeoutError(f"timed out after {timeout}s waiting for the job to be {names}")

    async def wait_final(self, *, timeout: float | None = None) -> JobStatus:
        """Wait until the job has succeeded or failed."""
        return await self.wait([JobState.SUCCEEDED, JobState.FAILED], timeout=timeout)

    def watch(self) -> JobStateWatch:
        """An async iterator of statuses: the current one, then each change."""
        return JobStateWatch(self)


class JobStateWatch(AsyncResource):
    """Statuses of a :class:`JobStateRecord`: the current one first, then every write.

    Connection errors do not end it: it watches again from where it stopped, so no write is
    missed or reported twice. If the history it missed has been compacted meanwhile, it reads
    the record and reports its status if that changed since the last one reported.
    """

    def __init__(self, record: JobStateRecord) -> None:
        self._record = record
        self._watch = ResumingWatch(
            record.store, record.key, f"watching the job state {record.key!r}", self._read
        )
        self._pending: deque[JobStatus] = deque()
        self._started = False
        self._closed = False
        self._present = False  # whether the key existed at the last status reported
        self._last_revision = 0

    async def _read(self) -> int:
        store, key = self._record.store, self._record.key
        snapshot = await store.range(key)
        kv = next((kv for kv in snapshot if kv.key == key), None)
        changed = kv is not None and kv.mod_revision > self._last_revision
        if not self._started or changed:  # the first status, or a write missed meanwhile
            self._pending.append(self._record._status(kv))
        elif kv is None and self._present:  # deleted in the compacted history
            self._pending.append(JobStatus(JobState.PENDING, revision=snapshot.revision))
        self._present = kv is not None
        if kv is not None:
            self._last_revision = max(self._last_revision, kv.mod_revision)
        return snapshot.revision

    async def __aenter__(self) -> Self:
        await self._start()
        return self

    def __aiter__(self) -> Self:
        return self

    async def _start(self) -> None:
        if not self._started:
            await self._watch.resync()
            self._started = True

    async def __anext__(self) -> JobStatus:
        if self._closed:
            raise StopAsyncIteration
        await self._start()
        while not self._pending:
            event = await self._watch.next()
            if event is None or event.kv.key != self._record.key:
                continue
            self._last_revision = event.revision
            self._present = event.type is EventType.PUT
            if event.type is EventType.DELETE:
                self._pending.append(JobStatus(JobState.PENDING, revision=event.revision))
            else:
                self._pending.append(self._record._status(event.kv))
        return self._pending.popleft()

    async def aclose(self) -> None:
        self._closed = True
        await self._watch.aclose()
