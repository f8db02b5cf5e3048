"""Messages that say what to do: a store that does not answer, a closed run id, a standby node,
where a failed worker's output went, even etcd cluster sizes, and no metrics notice unasked."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers.agent import PY, ROOT, WORKER, _env, run_agent, wait_records
from helpers.waiting import until_logged

from aioelastic.agent import ElasticAgent, WorkerSpec
from aioelastic.agent import _membership as membership_module
from aioelastic.agent._agent import AgentState, WorkerFailure
from aioelastic.rendezvous import RendezvousParameters, create_handler

pytestmark = pytest.mark.timeout(120)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: nothing listens there


def test_a_store_that_does_not_answer_is_said_at_once() -> None:
    port = _closed_port()
    args = ["--nnodes=1:2", f"--rdzv-endpoint=127.0.0.1:{port}", "--no-python", "true"]
    proc = subprocess.Popen(
        [PY, "-m", "aioelastic", "run", *args],
        env=_env(),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        started = time.monotonic()
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "does not answer" in line or len(lines) > 20:
                break
        took = time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
    said = [line for line in lines if "does not answer" in line]
    assert said, "".join(lines)
    assert f"store at http://127.0.0.1:{port} does not answer" in said[0]
    assert "retrying with backoff for up to" in said[0]  # the client retries, within the join
    assert len(said) == 1  # once, not once per attempt
    assert took < 30


def _params(run_id: str, **config: str) -> RendezvousParameters:
    return RendezvousParameters(
        "memory", f"hints-{run_id}", run_id, 1, 1, last_call_timeout=0, **config
    )


def _spec(mode: str, out: Path) -> WorkerSpec:
    return WorkerSpec(
        entrypoint=[PY, WORKER, mode, str(out)], stop_timeout=5, env={"PYTHONPATH": str(ROOT)}
    )


@pytest.mark.asyncio
async def test_a_closed_run_id_suggests_a_new_id_or_reopen_closed(out: Path) -> None:
    closer = await create_handler(_params("closed"))
    await closer.set_closed()
    await closer.aclose()
    result = await ElasticAgent(_spec("ok", out), _params("closed")).run()
    assert result.state is AgentState.CLOSED
    assert "new --rdzv-id" in result.message
    assert "--rdzv-conf reopen_closed=1" in result.message
    # and the key it names does what it says
    result = await ElasticAgent(_spec("ok", out), _params("closed", reopen_closed="1")).run()
    assert result.state is AgentState.SUCCEEDED, result.summary()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_torchrun_plugin_on_a_closed_run_suggests_the_same() -> None:
    from torch.distributed.elastic.rendezvous import api as torch_api

    from aioelastic.testing.http import ServerThread
    from aioelastic.torchrun import create_torch_handler

    with ServerThread() as server:

        def params() -> torch_api.RendezvousParameters:
            return torch_api.RendezvousParameters(
                "aioelastic", server.url, "plugin", 1, 1, last_call_timeout=0
            )

        first = create_torch_handler(params())
        first.next_rendezvous()
        first.shutdown()  # torch's contract: closes the run
        again = create_torch_handler(params())
        try:
            with pytest.raises(torch_api.RendezvousClosedError, match="reopen_closed=1") as info:
                again.next_rendezvous()
            assert "new --rdzv-id" in str(info.value)
        finally:
            again.shutdown()


@pytest.mark.asyncio
async def test_a_standby_node_says_it_is_standing_by_and_why(
    out: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(membership_module, "STANDBY_CHECK", 0.2)
    member = ElasticAgent(_spec("sleep", out), _params("full"))
    running = asyncio.create_task(member.run())
    await wait_records(out / "starts.jsonl", 1, 30, "the member's worker did not start")
    standby = ElasticAgent(_spec("sleep", out), _params("full"))
    with caplog.at_level(logging.INFO, logger="aioelastic.agent"):
        async with until_logged("aioelastic.agent", "standing by", 30, lambda: caplog.text):
            waiting = asyncio.create_task(standby.run())
    assert "the job is full" in caplog.text
    standby.request_stop(15)
    member.request_stop(15)
    results = await asyncio.wait_for(asyncio.gather(waiting, running), 60)
    assert [r.state for r in results] == [AgentState.INTERRUPTED, AgentState.INTERRUPTED]


def test_the_failure_hint_does_not_say_log_dir_is_needed() -> None:
    text = WorkerFailure(0, 0, 0, 1, 3, None).describe()
    assert "--redirects or --tee keeps it in a file" in text
    assert "--log-dir" not in text  # -r alone writes files (in a temporary directory)


def test_an_even_etcd_cluster_is_warned_about() -> None:
    proc = subprocess.run(
        [PY, "-m", "aioelastic", "etcd", "--members=2", "--binary=/nonexistent/etcd"],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "warning: a 2-member cluster tolerates no member failure" in proc.stderr
    assert "use an odd number" in proc.stderr


def test_no_metrics_notice_when_no_metrics_were_asked_for(tmp_path: Path) -> None:
    blocker = tmp_path / "prometheus_client.py"
    blocker.write_text("raise ImportError('not installed (test)')\n")
    env = _env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    proc = run_agent("--standalone", "--no-python", "true", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "standalone: HTTP store" in proc.stderr
    assert "prometheus" not in proc.stderr
