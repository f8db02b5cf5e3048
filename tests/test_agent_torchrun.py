"""The torchrun plugin: torch's own agent (``torch.distributed.run``) rendezvousing through
aioelastic (``--rdzv-backend aioelastic``) on loopback. Skipped when torch is not installed."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest
from agent_helpers import PY, ROOT, WORKER, _assert_no_orphans, _env, _lines, _parent_of, out

from aioelastic.store.http.server import HttpStoreServer

__all__ = ["out"]  # the fixture

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="torch is not installed (optional)"
    ),
]

# torchrun with the backend registered by hand (the entry point needs the package installed)
LAUNCH = (
    "import sys; from aioelastic.torchrun import register; register(); "
    "from torch.distributed.run import main; sys.exit(main())"
)


async def _torchrun(*args: str) -> asyncio.subprocess.Process:
    env = _env()
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return await asyncio.create_subprocess_exec(
        PY,
        "-c",
        LAUNCH,
        "--rdzv-backend=aioelastic",
        "--local-addr=127.0.0.1",
        "--monitor-interval=0.1",
        *args,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _finish(proc: asyncio.subprocess.Process, timeout: float) -> tuple[int, str, str]:
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        stdout, stderr = await proc.communicate()
        raise AssertionError(f"torchrun did not finish in {timeout}s:\n{stderr.decode()}") from None
    assert proc.returncode is not None
    return proc.returncode, stdout.decode(), stderr.decode()


@pytest.mark.asyncio
async def test_two_torchrun_nodes_allreduce_over_aioelastic() -> None:
    example = str(ROOT / "examples" / "torch_allreduce.py")
    async with HttpStoreServer(port=0) as server:
        args = (
            f"--rdzv-endpoint={server.url}",
            "--rdzv-id=torchrun-two",
            "--nnodes=2",
            "--nproc-per-node=1",
            example,
        )
        nodes = [await _torchrun(*args) for _ in range(2)]
        results = [await _finish(node, 120) for node in nodes]
    for code, _stdout, stderr in results:
        assert code == 0, stderr
    outputs = "".join(stdout for _code, stdout, _stderr in results)
    assert outputs.count("all_reduce(sum of rank+1) = 3") == 2, outputs


@pytest.mark.asyncio
async def test_killed_torchrun_node_makes_the_other_reform(out: Path) -> None:
    async with HttpStoreServer(port=0) as server:
        args = (
            f"--rdzv-endpoint=127.0.0.1:{server.port}",
            "--rdzv-id=torchrun-shrink",
            "--nnodes=1:2",
            "--nproc-per-node=2",
            "--rdzv-conf=last_call_timeout=3,keep_alive_interval=0.3,keep_alive_max_attempt=3",
            WORKER,
            "elastic",
            str(out),
        )
        nodes = [await _torchrun(*args) for _ in range(2)]
        victim_workers: set[int] = set()
        try:
            deadline = time.monotonic() + 60
            while (
                len(big := [s for s in _lines(out / "starts.jsonl") if s["WORLD_SIZE"] == "4"]) < 4
            ):
                assert time.monotonic() < deadline, "the 2-node round did not start"
                await asyncio.sleep(0.05)
            (out / "shrink").touch()
            group = big[-1]["GROUP_RANK"]
            victim_workers = {s["pid"] for s in big if s["GROUP_RANK"] == group}
            parents = {_parent_of(pid) for pid in victim_workers}
            (victim,) = [n for n in nodes if n.pid in parents]
            (survivor,) = [n for n in nodes if n is not victim]
            victim.send_signal(signal.SIGKILL)
            code, _stdout, stderr = await _finish(survivor, 120)
            await victim.wait()
        finally:
            for node in nodes:
                if node.returncode is None:
                    node.kill()
                    await node.wait()
            # torch's agent gives its workers no death signal: its orphans are cleaned up here
            for pid in victim_workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert code == 0, stderr
    small = [s for s in _lines(out / "starts.jsonl") if s["WORLD_SIZE"] == "2"]
    assert sorted(s["RANK"] for s in small) == ["0", "1"]
    _assert_no_orphans(str(out))
