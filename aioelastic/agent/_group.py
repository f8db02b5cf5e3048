"""The agent's local worker group: start one round's workers, stop them, kill what is left, and
describe the ones that failed (with the watchdog scope that reaped them, if one did)."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import uuid

from ..rendezvous import RendezvousResult
from ._result import WorkerFailure
from ._spec import WorkerSpec
from ._worker_env import WorkerEnvironment
from ._workers import Std, WorkerProcess, kill_groups, parse_std, spawn_worker, stop_workers

__all__ = ["WorkerGroup"]

log = logging.getLogger("aioelastic.agent")


class WorkerGroup:
    """The local workers of the current round (none between rounds).

    Output goes as ``spec.redirects``/``spec.tee`` say, log files under ``log_dir`` (one folder
    per attempt); :meth:`prepare_log_dir` makes a temporary one when output is redirected and no
    ``log_dir`` was given.
    """

    def __init__(self, spec: WorkerSpec, environment: WorkerEnvironment) -> None:
        self.spec = spec
        self.environment = environment
        self.log_dir = spec.log_dir
        self.workers: list[WorkerProcess] = []
        self._redirects = parse_std(spec.redirects, spec.nproc_per_node, "redirects")
        self._tee = parse_std(spec.tee, spec.nproc_per_node, "tee")
        self._reaped: dict[int, str] = {}  # pid -> the watchdog scope that expired

    @property
    def up(self) -> int:
        """How many local workers are running now."""
        return sum(1 for w in self.workers if w.returncode is None)

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def prepare_log_dir(self) -> None:
        """A temporary log directory when output goes to files and none was given."""
        if self.log_dir is None and any(
            self._redirects[r] | self._tee[r] for r in range(self.spec.nproc_per_node)
        ):
            # kept after the run (unlike the timer socket's directory): the summary points there
            self.log_dir = tempfile.mkdtemp(prefix="aioelastic-logs-")
            log.info("worker logs under %s", self.log_dir)

    async def spawn(self, rdzv: RendezvousResult, restarts: int) -> None:
        """Start the round's workers (``restarts``: their ``TORCHELASTIC_RESTART_COUNT``)."""
        spec = self.spec
        attempt_dir = None
        if self.log_dir is not None:
            attempt_dir = os.path.join(
                self.log_dir, f"{rdzv.run_id}", f"round_{rdzv.round}_{uuid.uuid4().hex[:6]}"
            )
        shown = spec.local_ranks_filter
        for local_rank in range(spec.nproc_per_node):
            quiet = shown is not None and local_rank not in shown
            redirect, tee = self._redirects[local_rank], self._tee[local_rank]
            worker = await spawn_worker(
                list(spec.entrypoint),
                self.environment.for_rank(rdzv, local_rank, restarts),
                local_rank=local_rank,
                rank=rdzv.rank * spec.nproc_per_node + local_rank,
                log_dir=None if attempt_dir is None else os.path.join(attempt_dir, str(local_rank)),
                redirect=redirect | tee if quiet else redirect,  # as torchrun: files, no console
                tee=Std.NONE if quiet else tee,
                console=not quiet,
            )
            self.workers.append(worker)

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """``sig`` to the workers, SIGKILL after ``spec.stop_timeout``; the group is empty after."""
        workers, self.workers = self.workers, []
        try:
            await stop_workers(workers, self.spec.stop_timeout, sig)
        finally:
            kill_groups(workers)

    def kill(self) -> None:
        """SIGKILL every worker's process group now (synchronous: safe on any exit path)."""
        kill_groups(self.workers)

    async def reap_all(self) -> None:
        """Kill and reap whatever is left at once (closing)."""
        kill_groups(self.workers)
        if self.workers:
            await stop_workers(self.workers, 0)
            self.workers = []

    def reaped(self, pid: int, scope: str) -> None:
        """The watchdog timer ``scope`` of worker ``pid`` expired (its failure will say so)."""
        self._reaped[pid] = scope

    def failure(self, rdzv: RendezvousResult, worker: WorkerProcess) -> WorkerFailure:
        code = worker.returncode
        assert code is not None
        return WorkerFailure(
            round=rdzv.round,
            rank=worker.rank,
            local_rank=worker.local_rank,
            pid=worker.pid,
            exitcode=code,
            log_path=worker.stderr_path or worker.stdout_path,
            reaped_scope=self._reaped.pop(worker.pid, None),
        )
