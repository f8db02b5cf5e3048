"""Local worker processes: spawn them in their own process groups, wait on them, stop them.

Every worker is an asyncio subprocess started in a new session (``start_new_session``), so its
process group holds the worker and anything it forks; stopping a worker signals the whole group.
On Linux each worker also gets ``PR_SET_PDEATHSIG(SIGKILL)``, so a worker dies with its agent even
when the agent itself is SIGKILLed and has no chance to clean up. Exits are awaited
(``await proc.wait()``), never polled. Output goes to the console, to per-worker log files
(``--redirects``), or both (``--tee``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from .._proc import die_with_parent

__all__ = ["Std", "WorkerProcess", "kill_groups", "parse_std", "spawn_worker", "stop_workers"]


class Std(enum.IntFlag):
    """Which streams of a worker go to its log files: torchrun's ``--redirects``/``--tee`` values
    (0 none, 1 stdout, 2 stderr, 3 both)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


def parse_std(text: str | int | Std, nproc: int, name: str = "redirects") -> dict[int, Std]:
    """torchrun's form: ``"3"`` for every local rank, or ``"0:1,1:2"`` per local rank."""
    if isinstance(text, (int, Std)) and not isinstance(text, bool):
        if not 0 <= int(text) <= 3:
            raise ValueError(f"{name} must be 0..3, got {text!r}")
        return dict.fromkeys(range(nproc), Std(int(text)))
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str or int, got {type(text).__name__}")
    form = "0..3 for all local ranks, or LOCAL_RANK:0..3 pairs separated by ','"
    text = text.strip()
    if text.isdigit():
        value = int(text)
        if value > 3:
            raise ValueError(f"{name}: {text!r} is not {form}")
        return dict.fromkeys(range(nproc), Std(value))
    result = dict.fromkeys(range(nproc), Std.NONE)
    for item in text.split(","):
        rank_text, sep, value_text = item.strip().partition(":")
        if not sep or not rank_text.strip().isdigit() or not value_text.strip().isdigit():
            raise ValueError(f"{name}: {item!r} is not {form}")
        rank, value = int(rank_text), int(value_text)
        if value > 3:
            raise ValueError(f"{name}: {item!r} is not {form}")
        if rank >= nproc:
            raise ValueError(f"{name}: local rank {rank} is out of range 0..{nproc - 1}")
        result[rank] = Std(value)
    return result


@dataclass(eq=False)
class WorkerProcess:
    """One running (or exited) local worker and where its output goes."""

    local_rank: int
    rank: int
    proc: asyncio.subprocess.Process
    stdout_path: str | None
    stderr_path: str | None
    started_at: float
    waiter: asyncio.Task[int]
    copiers: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


async def _copy(
    stream: asyncio.StreamReader, log: IO[bytes] | None, console: IO[bytes], prefix: bytes
) -> None:
    """``--tee``: copy a worker's stream line by line to its log file and the console."""
    try:
        while True:
            line = await stream.readline()
            if not line:
                return
            if log is not None:
                log.write(line)
                log.flush()
            console.write(prefix + line)
            console.flush()
    finally:
        if log is not None:
            log.close()


def _open_logs(log_dir: str | None, to_file: Std) -> tuple[IO[bytes] | None, IO[bytes] | None]:
    """Open (append) the log files of the streams in ``to_file`` under ``log_dir``."""
    if log_dir is None or not to_file:
        return None, None
    os.makedirs(log_dir, exist_ok=True)
    out_log = err_log = None
    try:
        if to_file & Std.OUT:
            out_log = open(os.path.join(log_dir, "stdout.log"), "ab")  # noqa: SIM115
        if to_file & Std.ERR:
            err_log = open(os.path.join(log_dir, "stderr.log"), "ab")  # noqa: SIM115
    except BaseException:
        if out_log is not None:
            out_log.close()
        raise
    return out_log, err_log


async def spawn_worker(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    local_rank: int,
    rank: int,
    log_dir: str | None,
    redirect: Std,
    tee: Std,
    console: bool = True,
) -> WorkerProcess:
    """Start one worker in its own session; its log files go under ``log_dir`` (if any).

    ``console=False``: a stream neither redirected nor tee'd is discarded
    (``--local-ranks-filter``).
    """
    out_log, err_log = _open_logs(log_dir, redirect | tee)
    stdout_path = None if out_log is None else out_log.name
    stderr_path = None if err_log is None else err_log.name
    files = [f for f in (out_log, err_log) if f is not None]
    stdout, stderr = _child_streams(out_log, err_log, tee, console)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL, main_thread_only=False),
        )
    except BaseException:
        for f in files:
            f.close()
        raise
    loop = asyncio.get_running_loop()
    worker = WorkerProcess(
        local_rank=local_rank,
        rank=rank,
        proc=proc,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        started_at=loop.time(),
        waiter=loop.create_task(proc.wait(), name=f"aioelastic-worker-{rank}"),
    )
    _tee_streams(worker, out_log, err_log, tee)
    return worker


def _child_streams(
    out_log: IO[bytes] | None, err_log: IO[bytes] | None, tee: Std, console: bool
) -> tuple[Any, Any]:
    """The child's stdout and stderr: a pipe to copy (tee'd), its log file, the console (None),
    or nothing (``console=False``)."""
    stdout: Any = asyncio.subprocess.PIPE if tee & Std.OUT else out_log
    stderr: Any = asyncio.subprocess.PIPE if tee & Std.ERR else err_log
    if not console:
        stdout = asyncio.subprocess.DEVNULL if stdout is None else stdout
        stderr = asyncio.subprocess.DEVNULL if stderr is None else stderr
    return stdout, stderr


def _tee_streams(
    worker: WorkerProcess, out_log: IO[bytes] | None, err_log: IO[bytes] | None, tee: Std
) -> None:
    """Copy the tee'd streams to their log file and the console; close the log files the
    child writes itself (it has its own descriptors)."""
    loop = asyncio.get_running_loop()
    proc, prefix = worker.proc, f"[rank{worker.rank}]: ".encode()
    if tee & Std.OUT and proc.stdout is not None:
        worker.copiers.append(
            loop.create_task(_copy(proc.stdout, out_log, sys.stdout.buffer, prefix))
        )
    elif out_log is not None:
        out_log.close()  # the child has its own descriptor
    if tee & Std.ERR and proc.stderr is not None:
        worker.copiers.append(
            loop.create_task(_copy(proc.stderr, err_log, sys.stderr.buffer, prefix))
        )
    elif err_log is not None:
        err_log.close()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_groups(workers: Sequence[WorkerProcess]) -> None:
    """SIGKILL every worker's process group now (synchronous: safe on any exit path)."""
    for worker in workers:
        _signal_group(worker.pid, signal.SIGKILL)


async def stop_workers(
    workers: Sequence[WorkerProcess], grace: float, sig: int = signal.SIGTERM
) -> None:
    """Signal the workers still running (``sig``, SIGTERM by default; the agent forwards the
    signal that stopped it, as torchrun), SIGKILL what is left after ``grace`` seconds.

    Every worker's group is SIGKILLed in the end, exited workers included, so nothing they
    forked survives them; returns once every worker has been reaped.
    """
    running = [w for w in workers if w.returncode is None]
    for worker in running:
        _signal_group(worker.pid, sig)
    if running and grace > 0:
        await asyncio.wait([w.waiter for w in running], timeout=grace)
    kill_groups(workers)
    waiters = [w.waiter for w in workers]
    if waiters:
        await asyncio.wait(waiters)
    copiers = [t for w in workers for t in w.copiers]
    if copiers:  # the pipes closed with the processes
        await asyncio.wait(copiers, timeout=5.0)
        for task in copiers:
            task.cancel()
