"""The agent's pieces and in-process behaviour: argument parsing, validation, cancellation,
membership changes (two in-process agents over the memory store), the worker-side helpers."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.agent import PY, ROOT, WORKER, _alive_with, _assert_no_orphans, _lines, wait_records

from aioelastic.agent import AgentState, ElasticAgent, Std, WorkerSpec, parse_std
from aioelastic.agent._cli import build_entrypoint, parse_nnodes, parse_nproc
from aioelastic.agent.worker import WorkerEnv
from aioelastic.errors import StoreConnectionError
from aioelastic.events import Event
from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousParameters
from aioelastic.store import MemoryStore
from aioelastic.testing.faults import FaultInjectingStore

pytestmark = pytest.mark.timeout(120)


def test_parse_std() -> None:
    assert parse_std("3", 2) == {0: Std.ALL, 1: Std.ALL}
    assert parse_std(1, 2) == {0: Std.OUT, 1: Std.OUT}
    assert parse_std("0:1,1:2", 3) == {0: Std.OUT, 1: Std.ERR, 2: Std.NONE}
    for bad in ("4", "x", "0:9", "0=1", "5:1"):
        with pytest.raises(ValueError, match="redirects"):
            parse_std(bad, 2)


def test_parse_nnodes_and_nproc() -> None:
    assert parse_nnodes("2") == (2, 2)
    assert parse_nnodes("1:4") == (1, 4)
    for bad in ("0", "3:2", "a", "1:b"):
        with pytest.raises(ValueError, match="--nnodes"):
            parse_nnodes(bad)
    assert parse_nproc("3") == 3
    assert parse_nproc("cpu") == (os.cpu_count() or 1)
    for bad in ("0", "x"):
        with pytest.raises(ValueError, match="--nproc-per-node"):
            parse_nproc(bad)


def _ns(*entry: str, module: bool = False, no_python: bool = False) -> argparse.Namespace:
    return argparse.Namespace(entrypoint=list(entry), module=module, no_python=no_python)


def test_build_entrypoint() -> None:
    assert build_entrypoint(_ns("--", "train.py", "--lr", "1")) == [
        sys.executable,
        "-u",
        "train.py",
        "--lr",
        "1",
    ]
    assert build_entrypoint(_ns("pkg.train", module=True)) == [
        sys.executable,
        "-u",
        "-m",
        "pkg.train",
    ]
    assert build_entrypoint(_ns("./run.py", no_python=True)) == ["./run.py"]
    # as torchrun: a COMMAND without .py still runs with Python unless --no-python
    assert build_entrypoint(_ns("train", "hi")) == [sys.executable, "-u", "train", "hi"]
    assert build_entrypoint(_ns("echo", "hi", no_python=True)) == ["echo", "hi"]
    with pytest.raises(ValueError, match="--no-python and --module"):
        build_entrypoint(_ns("x", module=True, no_python=True))
    with pytest.raises(ValueError, match="COMMAND"):
        build_entrypoint(_ns("--"))


def test_worker_spec_validation() -> None:
    with pytest.raises(ValueError, match="entrypoint"):
        WorkerSpec(entrypoint="train.py")
    with pytest.raises(ValueError, match="nproc_per_node"):
        WorkerSpec(entrypoint=["x"], nproc_per_node=0)
    with pytest.raises(ValueError, match="max_restarts"):
        WorkerSpec(entrypoint=["x"], max_restarts=-1)
    with pytest.raises(ValueError, match="stop_timeout"):
        WorkerSpec(entrypoint=["x"], stop_timeout=-1)
    with pytest.raises(ValueError, match="tee"):
        WorkerSpec(entrypoint=["x"], tee="7")
    with pytest.raises(TypeError, match="rendezvous"):
        ElasticAgent(WorkerSpec(entrypoint=["x"]), "c10d")  # type: ignore[arg-type]


def test_cli_errors() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "aioelastic", "run", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )

    proc = run("--standalone")
    assert proc.returncode == 2
    assert "COMMAND" in proc.stderr
    proc = run("--nnodes=1:2", "x.py")  # elastic needs a store (a fixed --nnodes 2: static)
    assert proc.returncode == 2
    assert "--rdzv-endpoint" in proc.stderr
    proc = run("--nnodes=2:1", "x.py")
    assert proc.returncode == 2
    assert "--nnodes" in proc.stderr


def test_worker_env_from_environ() -> None:
    env = {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "r",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "2",
    }
    w = WorkerEnv.from_environ(env)
    assert (w.rank, w.world_size, w.group_rank, w.master_port, w.round) == (3, 4, 1, 29500, None)
    with pytest.raises(KeyError, match="RANK"):
        WorkerEnv.from_environ({})
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        WorkerEnv.from_environ({**env, "WORLD_SIZE": "four"})


def _spec(mode: str, out: Path, **kw: object) -> WorkerSpec:
    return WorkerSpec(
        entrypoint=[PY, WORKER, mode, str(out)],
        nproc_per_node=2,
        stop_timeout=5,
        env={"PYTHONPATH": str(ROOT)},
        **kw,  # type: ignore[arg-type]
    )


async def _wait_starts(out: Path, n: int, timeout: float = 30) -> None:
    await wait_records(out / "starts.jsonl", n, timeout, "workers did not start")


@pytest.mark.asyncio
async def test_cancelled_run_kills_its_workers(out: Path) -> None:
    params = RendezvousParameters("memory", "", "cancel", 1, 1, last_call_timeout=0)
    agent = ElasticAgent(_spec("sleep", out), params)
    task = asyncio.create_task(agent.run())
    await _wait_starts(out, 2)
    assert agent.workers_up == 2
    assert _alive_with(str(out))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert agent.workers_up == 0
    _assert_no_orphans(str(out))


@pytest.mark.asyncio
async def test_request_stop_is_graceful(out: Path) -> None:
    params = RendezvousParameters("memory", "", "stop", 1, 1, last_call_timeout=0)
    agent = ElasticAgent(_spec("sleep", out), params)
    task = asyncio.create_task(agent.run())
    await _wait_starts(out, 2)
    agent.request_stop(15)
    result = await asyncio.wait_for(task, 30)
    assert result.state is AgentState.INTERRUPTED
    assert result.exit_code == 128 + 15
    assert len(_lines(out / "terms.jsonl")) == 2  # SIGTERM, handled by the workers


@pytest.mark.asyncio
async def test_node_joining_restarts_the_group_without_counting_a_restart(out: Path) -> None:
    def params() -> RendezvousParameters:
        return RendezvousParameters("memory", "grow", "grow", 1, 2, last_call_timeout=0)

    first = ElasticAgent(_spec("grow", out, max_restarts=0), params())
    task = asyncio.create_task(first.run())
    await _wait_starts(out, 2)  # a world of 2: the workers wait
    second = ElasticAgent(_spec("grow", out, max_restarts=0), params())
    results = await asyncio.wait_for(asyncio.gather(task, second.run()), 60)
    for result in results:
        assert result.state is AgentState.SUCCEEDED, result.summary()
        assert result.restarts == 0
    assert results[0].rounds == 2
    assert results[1].rounds == 1
    worlds = sorted(s["WORLD_SIZE"] for s in _lines(out / "starts.jsonl"))
    assert worlds == ["2", "2", "4", "4", "4", "4"]
    assert len(_lines(out / "terms.jsonl")) == 2  # the first group was stopped gracefully


def _flaky_handler(failures: int, run_id: str) -> tuple[DynamicRendezvousHandler, MemoryStore]:
    """A handler whose first ``failures`` joins find the store unreachable (lease grant)."""
    inner = MemoryStore()
    store = FaultInjectingStore(inner)
    for _ in range(failures):
        store.fail_next("lease_grant", StoreConnectionError("store unreachable (injected)"))
    handler = DynamicRendezvousHandler(store, run_id, 1, 1, last_call_timeout=0, owns_store=True)
    return handler, inner


@pytest.mark.asyncio
async def test_agent_rejoins_while_the_store_is_unreachable(out: Path) -> None:
    handler, _ = _flaky_handler(2, "flaky")
    sink = _ListSink()
    agent = ElasticAgent(_spec("ok", out), handler, event_sink=sink)
    result = await asyncio.wait_for(agent.run(), 60)
    assert result.state is AgentState.SUCCEEDED, result.summary()
    assert result.rounds == 1
    retries = [e for e in sink.events if e.kind == "agent.rendezvous_retry"]
    assert len(retries) == 2
    assert "unreachable" in str(retries[0].fields["error"])
    await handler.aclose()


@pytest.mark.asyncio
async def test_agent_gives_up_after_the_retry_timeout(out: Path) -> None:
    handler, _ = _flaky_handler(1, "flaky-no-retry")
    agent = ElasticAgent(_spec("ok", out, rendezvous_retry_timeout=0), handler)
    result = await asyncio.wait_for(agent.run(), 60)
    assert result.state is AgentState.FAILED
    assert "rendezvous_retry_timeout=0" in result.message
    assert result.rounds == 0
    await handler.aclose()


class _ListSink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)
