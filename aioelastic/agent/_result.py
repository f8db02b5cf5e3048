"""How an :class:`~aioelastic.agent.ElasticAgent`'s run ended: :class:`RunResult`, its
:class:`AgentState` and the :class:`WorkerFailure` records of the workers that failed."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

__all__ = ["AgentState", "RunResult", "WorkerFailure"]


class AgentState(enum.Enum):
    """How a run ended."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CLOSED = "CLOSED"
    INTERRUPTED = "INTERRUPTED"


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """A worker that failed: which rank, how it ended, where its output is."""

    round: int
    rank: int
    local_rank: int
    pid: int
    exitcode: int
    log_path: str | None
    reaped_scope: str | None = None

    @property
    def signal_name(self) -> str | None:
        """``SIGKILL`` etc. when the worker died of a signal."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self) -> str:
        how = (
            f"exit code {self.exitcode}"
            if self.signal_name is None
            else f"killed by {self.signal_name}"
        )
        if self.reaped_scope is not None:
            how += f" (its watchdog timer {self.reaped_scope!r} expired)"
        where = self.log_path or "not captured (--redirects or --tee keeps it in a file)"
        return (
            f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid}, round "
            f"{self.round}): {how}; log: {where}"
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    """The outcome of :meth:`ElasticAgent.run`.

    ``failures`` are the failed workers of the last attempt (of every attempt in ``history``);
    ``restart_latencies`` the seconds from detecting a failure to the restarted workers running.
    """

    state: AgentState
    exit_code: int
    failures: tuple[WorkerFailure, ...] = ()
    history: tuple[WorkerFailure, ...] = ()
    restarts: int = 0
    rounds: int = 0
    message: str = ""
    restart_latencies: tuple[float, ...] = ()

    def summary(self) -> str:
        """A few lines a person can read: what happened and what failed where."""
        lines = [
            f"{self.state.value} (exit code {self.exit_code}) after {self.rounds} round(s), "
            f"{self.restarts} restart(s)" + (f": {self.message}" if self.message else "")
        ]
        lines += [f"  {failure.describe()}" for failure in self.failures]
        return "\n".join(lines)
