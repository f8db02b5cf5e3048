"""The agent's run as a small state machine: :class:`State` (JOIN, START, MONITOR, FAILURE, CHANGE,
EXIT), one method of :class:`RunLoop` per state, each naming the next."""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass, field
from typing import assert_never

from .. import _hints
from ..errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
)
from ..rendezvous import RendezvousEvent, RendezvousEventKind, RendezvousResult
from ._group import WorkerGroup
from ._membership import Membership, describe_event
from ._monitor import Outcome, watch_attempt
from ._progress import RejoinBudget, RunProgress
from ._result import AgentState, RunResult, WorkerFailure
from ._secrets import auth_failure
from ._spec import WorkerSpec
from ._stops import Stopped, StopRequest
from ._telemetry import AgentTelemetry

__all__ = ["RunLoop", "State"]

log = logging.getLogger("aioelastic.agent")


class State(enum.Enum):
    """The states of :meth:`RunLoop.run`; each has one method, which names the next::

        JOIN -> START -> MONITOR -> EXIT                        (succeeded, stopped)
                            |-----> FAILURE -> JOIN              (a restart left)
                            |          |------> CHANGE           (the failure followed a loss)
                            |          '------> EXIT             (no restart left)
                            '-----> CHANGE -> JOIN | EXIT        (re-form | the run was closed)

    JOIN and START go to EXIT when the rendezvous or the spawn cannot go on.
    """

    JOIN = "join"
    START = "start"
    MONITOR = "monitor"
    FAILURE = "failure"
    CHANGE = "change"
    EXIT = "exit"


@dataclass(slots=True)
class _Run:
    """What a run carries from state to state."""

    rdzv: RendezvousResult | None = None  # the round joined last
    failures: tuple[WorkerFailure, ...] = ()  # of the last failed attempt
    history: list[WorkerFailure] = field(default_factory=list)  # of every attempt
    change: RendezvousEvent | BaseException | None = None  # what CHANGE handles
    joined_at: float = 0.0
    end: tuple[AgentState, int, str] | None = None  # what EXIT reports

    @property
    def round(self) -> RendezvousResult:
        assert self.rdzv is not None
        return self.rdzv

    def finish(self, state: AgentState, code: int, message: str = "") -> State:
        self.end = (state, code, message)
        return State.EXIT


def _now() -> float:
    return asyncio.get_running_loop().time()


class RunLoop:
    """One run of an agent's parts: the rendezvous side, the worker group, the progress, the
    telemetry and the stop request. ``store`` names the store in the unreachable warning."""

    def __init__(
        self,
        spec: WorkerSpec,
        membership: Membership,
        group: WorkerGroup,
        progress: RunProgress,
        telemetry: AgentTelemetry,
        stop: StopRequest,
        store: str,
    ) -> None:
        self.spec = spec
        self.membership = membership
        self.group = group
        self.progress = progress
        self.telemetry = telemetry
        self.stop = stop
        self._store = store
        self._rejoin = RejoinBudget(spec.rendezvous_retry_timeout)
        self._run = _Run()

    async def run(self) -> RunResult:
        """The state machine: each state does its work and names the next (see :class:`State`)."""
        state = State.JOIN
        while True:
            match state:
                case State.JOIN:
                    state = await self._state_join()
                case State.START:
                    state = await self._state_start()
                case State.MONITOR:
                    state = await self._state_monitor()
                case State.FAILURE:
                    state = await self._state_failure()
                case State.CHANGE:
                    state = await self._state_change()
                case State.EXIT:
                    return self._state_exit()
                case _:  # pragma: no cover - mypy proves every state is handled
                    assert_never(state)

    async def _state_join(self) -> State:
        """JOIN: the next rendezvous round; START, or EXIT when the run cannot go on."""
        run, handler = self._run, self.membership.handler
        try:
            log.info("joining rendezvous %r (%s)", handler.run_id, handler.get_backend())
            run.joined_at = _now()
            rdzv = await self.stop.until(self.membership.join())
        except Stopped:
            return self._interrupted()
        except RendezvousGracefulExitError as exc:
            return run.finish(AgentState.CLOSED, 0, f"the run was closed: {exc}")
        except RendezvousClosedError as exc:
            hint = "" if self.progress.rounds else f"; {_hints.CLOSED_RUN}"  # a stale run id
            return run.finish(AgentState.CLOSED, 1, f"the run was closed: {exc}{hint}")
        except RendezvousConnectionError as exc:
            return await self._unreachable(exc)
        except RendezvousError as exc:
            return run.finish(AgentState.FAILED, 1, f"rendezvous failed: {exc}")
        run.rdzv = rdzv
        self._rejoin.reset()
        self.progress.joined(rdzv)
        self.telemetry.joined(rdzv, _now() - run.joined_at)
        return State.START

    async def _unreachable(self, exc: RendezvousConnectionError) -> State:
        """The store is unreachable for now: rejoin (a new lease) until the budget is spent."""
        run, timeout = self._run, self.spec.rendezvous_retry_timeout
        denied = auth_failure(exc)
        if denied is not None:  # no retry makes credentials right: fail now, say so
            return run.finish(
                AgentState.FAILED,
                1,
                f"rendezvous failed: the store refused our credentials: {denied} "
                "(http: give the token with --token-file or $AIOELASTIC_TOKEN; etcd: "
                "the user in the URL, the password with --password-file or "
                "$AIOELASTIC_ETCD_PASSWORD)",
            )
        now = _now()
        if self._rejoin.start(now):
            log.warning(
                "the rendezvous store at %s does not answer (%s); retrying until it "
                "does, for up to %.0f s (rendezvous_retry_timeout), then failing",
                self._store,
                exc,
                timeout,
            )
        delay = self._rejoin.next_delay(now)
        if delay is None:
            return run.finish(
                AgentState.FAILED,
                1,
                f"rendezvous failed: {exc} (the store stayed unreachable for "
                f"rendezvous_retry_timeout={timeout}s)",
            )
        log.warning("rendezvous failed, rejoining in %.2fs: %s", delay, exc)
        self.telemetry.emit("agent.rendezvous_retry", error=str(exc), delay=delay)
        try:
            await self.stop.until(asyncio.sleep(delay))  # a backoff, not a poll
        except Stopped:
            return self._interrupted()
        return State.JOIN

    async def _state_start(self) -> State:
        """START: spawn the local workers of the round; MONITOR, or EXIT when they cannot start."""
        rdzv = self._run.round
        try:
            await self.group.spawn(rdzv, self.progress.restarts)
        except OSError as exc:
            return self._run.finish(AgentState.FAILED, 1, f"could not start the workers: {exc}")
        ranks = [w.rank for w in self.group.workers]
        latency = self.progress.workers_running(_now())
        self.telemetry.workers_started(rdzv, ranks, self.group.pids, latency)
        return State.MONITOR

    async def _state_monitor(self) -> State:
        """MONITOR: wait for what ends the attempt; each :class:`Outcome` has its next state."""
        run = self._run
        rdzv = run.round
        attempt = await watch_attempt(rdzv, self.group, self.membership, self.stop)
        match attempt.outcome:
            case Outcome.SUCCEEDED:
                log.info("round %d: all local workers succeeded", rdzv.round)
                await self._stop_workers()  # reaps them and kills anything they left behind
                await self.membership.exit_barrier(rdzv, self.spec.exit_barrier_timeout, self.stop)
                return run.finish(AgentState.SUCCEEDED, 0)
            case Outcome.STOPPED:
                await self._stop_workers()
                return self._interrupted()
            case Outcome.FAILED:
                run.failures = attempt.failures
                return State.FAILURE
            case Outcome.CHANGED:
                assert attempt.change is not None
                run.change = attempt.change
                return State.CHANGE
            case _:  # pragma: no cover - mypy proves every outcome is handled
                assert_never(attempt.outcome)

    async def _state_failure(self) -> State:
        """FAILURE: stop the group; a loss of a node explains it (CHANGE), else restart (JOIN)
        or, with no restart left, close the run (EXIT)."""
        run, progress = self._run, self.progress
        rdzv = run.round
        progress.failed_at = _now()
        run.history.extend(run.failures)
        self.telemetry.workers_failed(run.failures)
        await self._stop_workers()
        loss = None
        if not progress.restart_left:
            loss = await self.membership.loss_within(rdzv, self.spec.loss_window)
        if loss is not None:
            log.info(
                "round %d: the worker failure(s) followed %s: re-forming, not counted as a restart",
                rdzv.round,
                describe_event(loss),
            )
            run.change = loss
            return State.CHANGE
        if not progress.restart_left:
            log.error("no restart left (max restarts %d): closing the run", progress.max_restarts)
            await self.membership.close_run()
            message = f"max restarts ({progress.max_restarts}) exhausted"
            return run.finish(AgentState.FAILED, 1, message)
        progress.count_restart(rdzv)
        self.telemetry.restart_counted()
        return State.JOIN

    async def _state_change(self) -> State:
        """CHANGE: the membership changed (or the rendezvous failed): stop the group gracefully
        and re-rendezvous (JOIN); a closed run ends (EXIT)."""
        run = self._run
        rdzv, event = run.round, run.change
        assert event is not None
        if isinstance(event, RendezvousEvent) and event.kind is RendezvousEventKind.CLOSED:
            log.info("round %d: the run was closed: stopping the workers", rdzv.round)
            await self._stop_workers()
            return run.finish(AgentState.CLOSED, 1, "the run was closed by another node")
        log.info(
            "round %d: %s: stopping the workers to re-rendezvous",
            rdzv.round,
            describe_event(event),
        )
        self.progress.interrupted(_now(), "membership_change")
        self.telemetry.membership_change(rdzv, event)
        await self._stop_workers()
        return State.JOIN

    def _state_exit(self) -> RunResult:
        """EXIT: the run's result (and its ``agent.finished`` event)."""
        run, progress = self._run, self.progress
        assert run.end is not None
        state, code, message = run.end
        self.telemetry.finished(state.value, code, message)
        return RunResult(
            state,
            code,
            run.failures,
            tuple(run.history),
            progress.restarts,
            progress.rounds,
            message,
            tuple(progress.latencies),
        )

    def _interrupted(self) -> State:
        code, message = self.stop.exit()
        return self._run.finish(AgentState.INTERRUPTED, code, message)

    async def _stop_workers(self) -> None:
        await self.group.stop(self.stop.worker_signal)
