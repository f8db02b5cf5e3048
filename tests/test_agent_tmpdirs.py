"""A SIGKILLed agent's temporary directory (its timer socket) is removed by the next agent that
starts; live agents' directories, other names and other users' files are left alone."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.agent import PY, ROOT, WORKER, _env, run_agent, wait_records_sync

from aioelastic.agent._tmpdirs import PREFIX, clean_stale_dirs

pytestmark = pytest.mark.timeout(120)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: a unix socket's path must fit in 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="aioe-t-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _agent_dir(
    root: Path, pid: int, tag: str, *, listening: bool = False
) -> tuple[Path, socket.socket]:
    d = root / f"{PREFIX}{pid}-{tag}"
    d.mkdir()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(d / "timer.sock"))
    if listening:
        sock.listen()
    else:
        sock.close()  # the file stays, nothing answers: what SIGKILL leaves
    return d, sock


def test_only_dead_agents_dirs_are_removed(short_tmp: Path) -> None:
    tmp_path = short_tmp
    stale, _ = _agent_dir(tmp_path, _dead_pid(), "stale")
    no_socket = tmp_path / f"{PREFIX}{_dead_pid()}-nosock"
    no_socket.mkdir()
    answering, listener = _agent_dir(tmp_path, _dead_pid(), "answers", listening=True)
    alive, _ = _agent_dir(tmp_path, os.getppid(), "alive")
    legacy = tmp_path / f"{PREFIX}abc123_x"  # no pid recorded: not ours to judge
    legacy.mkdir()
    a_file = tmp_path / f"{PREFIX}{_dead_pid()}-file"
    a_file.write_text("")
    try:
        removed = clean_stale_dirs(str(tmp_path))
    finally:
        listener.close()
    assert sorted(removed) == sorted([str(stale), str(no_socket)])
    assert not stale.exists()
    assert not no_socket.exists()
    for kept in (answering, alive, legacy, a_file):
        assert kept.exists(), kept


def test_a_sigkilled_agent_leaves_nothing_once_another_starts(short_tmp: Path, out: Path) -> None:
    tmp = short_tmp
    env = {**_env(), "TMPDIR": str(tmp)}
    agent = subprocess.Popen(
        [PY, "-m", "aioelastic", "run", "--standalone", WORKER, "sleep", str(out)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_records_sync(out / "starts.jsonl", 1, 30, "the worker did not start")
        left = [p.name for p in tmp.iterdir() if p.name.startswith(PREFIX)]
        assert len(left) == 1
        assert left[0].startswith(f"{PREFIX}{agent.pid}-")
        agent.send_signal(signal.SIGKILL)
        agent.wait(30)
    finally:
        agent.kill()
        agent.wait()
    assert [p.name for p in tmp.iterdir() if p.name.startswith(PREFIX)] == left  # stale
    done = run_agent("--standalone", "--no-python", "true", env=env)
    assert done.returncode == 0, done.stderr
    assert "removed 1 temporary directory(ies) of dead aioelastic-agent-*" in done.stderr
    assert [p.name for p in tmp.iterdir() if p.name.startswith(PREFIX)] == []
