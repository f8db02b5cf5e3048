"""End-to-end tests of the elastic agent and ``aioelastic run``: real processes on loopback.

Every test gives its workers a unique directory on their command line and checks at the end that
no process mentioning it is left (``/proc``), so an orphaned worker fails the test.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import finish
from helpers.agent import (
    PY,
    ROOT,
    WORKER,
    _assert_no_orphans,
    _env,
    _lines,
    _parent_of,
    wait_records,
    wait_records_sync,
)
from helpers.agent import run_agent as _run

from aioelastic.agent import AgentState, ElasticAgent, WorkerSpec
from aioelastic.rendezvous import RendezvousParameters
from aioelastic.store.http.server import HttpStoreServer

pytestmark = pytest.mark.timeout(120)


async def _spawn_agent(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        PY,
        "-m",
        "aioelastic",
        "run",
        *args,
        env=_env(),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.mark.asyncio
async def test_two_agents_two_workers_each(out: Path) -> None:
    async with HttpStoreServer(port=0) as server:
        common = [
            "--nnodes=2",
            "--nproc-per-node=2",
            f"--rdzv-endpoint={server.url}",  # a store URL works as well as host:port
            "--rdzv-id=two-by-two",
            "--local-addr=127.0.0.1",
            "--",
            WORKER,
            "ok",
            str(out),
        ]
        agents = [await _spawn_agent(*common) for _ in range(2)]
        results = [await finish(agent, 60, "agent") for agent in agents]
    for code, _, stderr in results:
        assert code == 0, stderr
        assert "SUCCEEDED" in stderr
    starts = _lines(out / "starts.jsonl")
    assert sorted(int(s["RANK"]) for s in starts) == [0, 1, 2, 3]
    assert {s["WORLD_SIZE"] for s in starts} == {"4"}
    assert {s["LOCAL_WORLD_SIZE"] for s in starts} == {"2"}
    assert sorted(s["GROUP_RANK"] for s in starts) == ["0", "0", "1", "1"]
    assert {s["GROUP_WORLD_SIZE"] for s in starts} == {"2"}
    assert all(s["ROLE_RANK"] == s["RANK"] and s["ROLE_WORLD_SIZE"] == "4" for s in starts)
    for s in starts:  # RANK = GROUP_RANK * nproc + LOCAL_RANK
        assert int(s["RANK"]) == int(s["GROUP_RANK"]) * 2 + int(s["LOCAL_RANK"])
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in starts}) == 1
    assert starts[0]["MASTER_ADDR"] == "127.0.0.1"
    assert {s["TORCHELASTIC_RUN_ID"] for s in starts} == {"two-by-two"}
    assert {s["TORCHELASTIC_RESTART_COUNT"] for s in starts} == {"0"}
    assert len({s["AIOELASTIC_TIMER_SOCKET"] for s in starts}) == 2  # one server per agent


@pytest.mark.asyncio
async def test_no_restart_left_closes_the_run_for_every_node(out: Path) -> None:
    async with HttpStoreServer(port=0) as server:
        common = [
            "--nnodes=2",
            "--nproc-per-node=2",
            f"--rdzv-endpoint=127.0.0.1:{server.port}",
            "--rdzv-id=fail-all",
            "--local-addr=127.0.0.1",
            "--stop-timeout=5",
            WORKER,
            "fail-always",
            str(out),
        ]
        agents = [await _spawn_agent(*common) for _ in range(2)]
        results = [await finish(agent, 60, "agent") for agent in agents]
    assert sorted(code for code, _, _ in results) == [1, 1]
    messages = sorted(stderr for _, _, stderr in results)
    assert any("max restarts (0) exhausted" in m for m in messages), messages
    assert any("the run was closed by another node" in m for m in messages), messages


def test_failed_worker_is_restarted(out: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = _run(
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--stop-timeout=5",
        "--redirects=3",
        f"--log-dir={logs}",
        WORKER,
        "fail-once",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    starts = _lines(out / "starts.jsonl")
    attempts = sorted((s["TORCHELASTIC_RESTART_COUNT"], s["RANK"]) for s in starts)
    assert attempts == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {s["TORCHELASTIC_MAX_RESTARTS"] for s in starts} == {"1"}
    # the healthy rank was stopped gracefully (SIGTERM) before the restart
    terms = _lines(out / "terms.jsonl")
    assert [(t["RANK"], t["TORCHELASTIC_RESTART_COUNT"]) for t in terms] == [("0", "0")]
    assert "restarting the workers (1/1)" in proc.stderr
    # per-worker logs: the failing rank's stderr is under --log-dir
    stderr_logs = list(logs.rglob("1/stderr.log"))
    assert any("fails on purpose" in p.read_text() for p in stderr_logs), stderr_logs
    failed_at = _lines(out / "failures.jsonl")[0]["time"]
    restarted = min(s["time"] for s in starts if s["TORCHELASTIC_RESTART_COUNT"] == "1")
    print(f"\nfailure -> restarted worker running (python start included): "
          f"{restarted - failed_at:.3f} s")  # fmt: skip
    assert restarted - failed_at < 10


def test_max_restarts_is_honoured(out: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = _run(
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=2",
        "--stop-timeout=5",
        "--redirects=2",
        f"--log-dir={logs}",
        WORKER,
        "fail-always",
        str(out),
    )
    assert proc.returncode == 1, proc.stderr
    starts = _lines(out / "starts.jsonl")
    assert sorted(s["TORCHELASTIC_RESTART_COUNT"] for s in starts if s["RANK"] == "1") == [
        "0",
        "1",
        "2",
    ]
    assert "max restarts (2) exhausted" in proc.stderr
    summary = proc.stderr[proc.stderr.index("FAILED (exit code 1)") :]
    assert "rank 1 (local rank 1" in summary
    assert "exit code 3" in summary
    assert str(logs) in summary
    assert "stderr.log" in summary


@pytest.mark.asyncio
async def test_hung_worker_is_reaped_by_its_timer(out: Path) -> None:
    spec = WorkerSpec(
        entrypoint=[PY, WORKER, "hang-once", str(out)],
        nproc_per_node=2,
        max_restarts=1,
        stop_timeout=5,
        env={"PYTHONPATH": str(ROOT)},
    )
    params = RendezvousParameters("memory", "", "hang", 1, 1, last_call_timeout=0)
    async with ElasticAgent(spec, params) as agent:
        result = await asyncio.wait_for(agent.run(), 60)
    assert result.state is AgentState.SUCCEEDED, result.summary()
    assert result.exit_code == 0
    assert result.restarts == 1
    (failure,) = result.history
    assert failure.rank == 0
    assert failure.exitcode == -signal.SIGKILL
    assert failure.reaped_scope == "step"
    assert "watchdog timer 'step' expired" in failure.describe()
    hung = _lines(out / "failures.jsonl")[0]
    # killed at its 0.5 s deadline, not at the end of its 60 s sleep
    assert failure.pid == hung["pid"]
    print(f"\nagent: failure seen -> workers restarted in {result.restart_latencies[0]:.3f} s")
    assert result.restart_latencies[0] < 10


@pytest.mark.slow
@pytest.mark.asyncio
async def test_killed_agent_makes_the_other_reform_smaller(out: Path) -> None:
    async with HttpStoreServer(port=0) as server:
        common = [
            "--nnodes=1:2",
            "--nproc-per-node=2",
            f"--rdzv-endpoint=127.0.0.1:{server.port}",
            "--rdzv-id=shrink",
            "--rdzv-conf=last_call_timeout=3,keep_alive_interval=0.3,keep_alive_max_attempt=3",
            "--local-addr=127.0.0.1",
            "--stop-timeout=5",
            WORKER,
            "elastic",
            str(out),
        ]
        agents = [await _spawn_agent(*common) for _ in range(2)]
        try:
            big = await wait_records(out / "starts.jsonl", 4, 30, "the big round", WORLD_SIZE="4")
            (out / "shrink").touch()
            victim_group = big[-1]["GROUP_RANK"]
            victim_pids = {s["pid"] for s in big if s["GROUP_RANK"] == victim_group}
            # which agent is the victim? the parent of its workers
            parents = {_parent_of(pid) for pid in victim_pids}
            (victim,) = [a for a in agents if a.pid in parents]
            (survivor,) = [a for a in agents if a is not victim]
            killed_at = time.time()
            victim.kill()
            code, _, stderr = await finish(survivor, 60, "agent")
            await victim.wait()
        finally:
            for agent in agents:
                if agent.returncode is None:
                    agent.kill()
                    await agent.wait()
    assert code == 0, stderr
    assert "PARTICIPANT_LOST" in stderr
    small = [s for s in _lines(out / "starts.jsonl") if s["WORLD_SIZE"] == "2"]
    assert sorted(s["RANK"] for s in small) == ["0", "1"]
    assert {s["GROUP_WORLD_SIZE"] for s in small} == {"1"}
    reformed = min(s["time"] for s in small)
    print(f"\nagent SIGKILLed -> smaller world running: {reformed - killed_at:.3f} s "
          f"(lease TTL 0.9 s + last call 3 s + worker start)")  # fmt: skip
    # the killed agent's workers died with it (PDEATHSIG); the fixture checks nothing is left
    _assert_no_orphans(str(out))
    # its temporary directory (the timer socket) is what the next agent to start removes
    from aioelastic.agent._tmpdirs import PREFIX, clean_stale_dirs

    assert any(f"{PREFIX}{victim.pid}-" in path for path in clean_stale_dirs())


@pytest.mark.asyncio
@pytest.mark.parametrize("max_restarts", [0, 3])
async def test_a_lost_node_is_not_the_jobs_failure(out: Path, max_restarts: int) -> None:
    """The survivor's workers fail when a peer dies (a broken collective): that is the loss's
    consequence. The survivor re-forms without counting a restart (none needed with
    --max-restarts 0) and, every survivor being back, without waiting out the last call.

    The server keeps a dead session's leases 3 s (default 0.25 s; the lease TTL is 3 s too), so
    the survivor sees its workers fail before it sees the loss: the path under test (a failure
    the loss explains later). Seen the other way round, both are one membership change with no
    failure to count (``test_killed_agent_makes_the_other_reform_smaller`` is that path); with
    the default grace the two raced, and the log line this test looks for depended on which
    came first."""
    async with HttpStoreServer(port=0, session_grace=3.0) as server:
        common = [
            "--nnodes=1:2",
            "--nproc-per-node=2",
            f"--max-restarts={max_restarts}",
            f"--rdzv-endpoint=127.0.0.1:{server.port}",
            "--rdzv-id=fragile",
            "--rdzv-conf=last_call_timeout=30,keep_alive_interval=1,keep_alive_max_attempt=3",
            "--local-addr=127.0.0.1",
            "--stop-timeout=5",
            WORKER,
            "fragile",
            str(out),
        ]
        agents = [await _spawn_agent(*common) for _ in range(2)]
        try:
            big = await wait_records(out / "starts.jsonl", 4, 60, "the big round", WORLD_SIZE="4")
            victim_pids = {s["pid"] for s in big if s["GROUP_RANK"] == "1"}
            parents = {_parent_of(pid) for pid in victim_pids}
            (victim,) = [a for a in agents if a.pid in parents]
            (survivor,) = [a for a in agents if a is not victim]
            killed_at = time.monotonic()
            victim.kill()
            (out / "killed").touch()
            code, _, stderr = await finish(survivor, 60, "agent")
            took = time.monotonic() - killed_at
            await victim.wait()
        finally:
            for agent in agents:
                if agent.returncode is None:
                    agent.kill()
                    await agent.wait()
    assert code == 0, stderr
    assert "not counted as a restart" in stderr
    small = [s for s in _lines(out / "starts.jsonl") if s["WORLD_SIZE"] == "2"]
    assert sorted(s["RANK"] for s in small) == ["0", "1"]
    assert {s["TORCHELASTIC_RESTART_COUNT"] for s in small} == {"0"}
    assert took < 20, stderr  # the 3 s grace + worker start, not the 30 s last call
    _assert_no_orphans(str(out))


def test_sigterm_stops_workers_and_leaves(out: Path) -> None:
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "aioelastic",
            "run",
            "--standalone",
            "--nproc-per-node=2",
            WORKER,
            "sleep",
            str(out),
        ],
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_records_sync(out / "starts.jsonl", 2, 30, "workers did not start")
        proc.send_signal(signal.SIGTERM)
        _stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM" in stderr
    assert sorted(t["RANK"] for t in _lines(out / "terms.jsonl")) == ["0", "1"]


def test_example_store_sum_with_tee(tmp_path: Path) -> None:
    example = str(ROOT / "examples" / "store_sum.py")
    logs = tmp_path / "logs"
    proc = _run("--standalone", "--nproc-per-node=3", "--tee=1", f"--log-dir={logs}", example)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("sum of squares = 5") == 3, proc.stdout
    for rank in range(3):  # on the console with a prefix, and in the rank's log file
        assert f"[rank{rank}]: rank {rank}/3" in proc.stdout
        (log_file,) = logs.rglob(f"{rank}/stdout.log")
        assert log_file.read_text().startswith(f"rank {rank}/3")
    _assert_no_orphans(example)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (optional)"
)
def test_example_torch_allreduce() -> None:
    example = str(ROOT / "examples" / "torch_allreduce.py")
    proc = _run("--standalone", "--nproc-per-node=2", example, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("all_reduce(sum of rank+1) = 3") == 2, proc.stdout
    _assert_no_orphans(example)
