"""Store credentials of ``aioelastic run``, ``status`` and the torchrun plugin: taken from files
or the environment, never on a command line, never in a worker's environment (the workers get a
file's path and can still open the store), redacted in error text; a refused credential fails
the run at once instead of being retried as an unreachable store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.agent import PY, ROOT, _env

from aioelastic.etcd_server import EtcdServer
from aioelastic.rendezvous import RendezvousParameters
from aioelastic.store import open_store
from aioelastic.testing.http import ServerThread

pytestmark = pytest.mark.timeout(120)

TOKEN = "tok-" + uuid.uuid4().hex
PASSWORD = "pw-" + uuid.uuid4().hex

WORKER = """
import asyncio, json, os, sys
from aioelastic.agent.worker import open_worker_store

async def main():
    result = {
        "env": dict(os.environ),
        "cmdline": open("/proc/self/cmdline", "rb").read().decode(errors="replace"),
        "agent_cmdline": open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode(),
    }
    try:
        async with open_worker_store() as store:
            await store.put("from-worker", b"1")
        result["store"] = "ok"
    except Exception as exc:
        result["store"] = f"{type(exc).__name__}: {exc}"
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def http_server() -> Iterator[ServerThread]:
    with ServerThread(token=TOKEN) as server:
        yield server


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    from aioelastic.testing.etcd import running_etcd

    with running_etcd(auth=("root", PASSWORD)) as server:
        yield server


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, Any]:
    """``aioelastic run ARGS -- worker.py result.json``: (exit code, stderr, what it recorded)."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    result = tmp_path / f"result-{uuid.uuid4().hex}.json"
    full_env = _env()
    for name in ("AIOELASTIC_TOKEN", "AIOELASTIC_ETCD_PASSWORD"):
        full_env.pop(name, None)
    full_env.update(env or {})
    done = subprocess.run(
        [
            *(PY, "-m", "aioelastic", "run", "--rdzv-id", uuid.uuid4().hex, *args),
            *("--rdzv-conf", "last_call_timeout=0", "--", str(worker), str(result)),
        ],
        env=full_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    recorded = json.loads(result.read_text()) if result.exists() else None
    return done.returncode, done.stderr, recorded


def _assert_no_secret(recorded: Any, secret: str) -> None:
    assert recorded is not None
    leaks = {k: v for k, v in recorded["env"].items() if secret in v}
    assert not leaks, leaks
    assert secret not in recorded["cmdline"]
    assert secret not in recorded["agent_cmdline"]


def _endpoint(server: ServerThread) -> str:
    return server.url.removeprefix("http://")


@pytest.mark.parametrize("how", ["--token-file", "AIOELASTIC_TOKEN"])
def test_run_takes_the_http_token_from_a_file_or_the_environment_and_workers_get_a_path(
    tmp_path: Path, http_server: ServerThread, how: str
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    args = ["--rdzv-endpoint", _endpoint(http_server)]
    env = {}
    if how == "--token-file":
        args += ["--token-file", str(token_file)]
    else:
        env["AIOELASTIC_TOKEN"] = TOKEN
    code, stderr, recorded = _run(tmp_path, *args, env=env)
    assert code == 0, stderr
    _assert_no_secret(recorded, TOKEN)
    assert "AIOELASTIC_TOKEN" not in recorded["env"]
    assert recorded["store"] == "ok"  # the worker authenticated through the file
    path = recorded["env"]["AIOELASTIC_TOKEN_FILE"]
    if how == "--token-file":
        assert path == str(token_file)
    else:
        assert not os.path.exists(path)  # the private copy is removed when the run ends
    assert TOKEN not in stderr


def test_no_worker_store_secrets_gives_the_workers_nothing(
    tmp_path: Path, http_server: ServerThread
) -> None:
    code, stderr, recorded = _run(
        tmp_path,
        "--rdzv-endpoint",
        _endpoint(http_server),
        "--no-worker-store-secrets",
        env={"AIOELASTIC_TOKEN": TOKEN},
    )
    assert code == 0, stderr
    _assert_no_secret(recorded, TOKEN)
    assert "AIOELASTIC_TOKEN_FILE" not in recorded["env"]
    assert recorded["store"].startswith("StoreAuthError"), recorded["store"]


@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_refused_token_fails_the_run_at_once_and_says_so(
    tmp_path: Path, http_server: ServerThread, token: str | None
) -> None:
    args = ["--rdzv-endpoint", _endpoint(http_server)]
    if token is not None:
        (tmp_path / "token").write_text(token)
        args += ["--token-file", str(tmp_path / "token")]
    started = time.monotonic()
    code, stderr, recorded = _run(tmp_path, *args)
    elapsed = time.monotonic() - started
    assert code == 1, stderr
    assert "refused our credentials" in stderr, stderr
    assert "--token-file" in stderr
    assert "unreachable" not in stderr
    assert elapsed < 30, elapsed  # was: retried for rendezvous_retry_timeout (60 s)
    assert recorded is None  # no worker started


def test_run_reads_the_etcd_password_from_a_file_and_workers_get_a_path(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    endpoint = "etcd://root@" + etcd.endpoints[0]
    code, stderr, recorded = _run(
        tmp_path,
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        endpoint,
        "--password-file",
        str(password_file),
    )
    assert code == 0, stderr
    _assert_no_secret(recorded, PASSWORD)
    assert recorded["env"]["AIOELASTIC_STORE_URL"] == endpoint
    assert recorded["env"]["AIOELASTIC_ETCD_PASSWORD_FILE"] == str(password_file)
    assert recorded["store"] == "ok"


def test_a_password_in_the_endpoint_is_kept_from_the_workers_and_warned_about(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    code, stderr, recorded = _run(
        tmp_path,
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        f"etcd://root:{PASSWORD}@{etcd.endpoints[0]}",
    )
    assert code == 0, stderr
    assert "visible to every user (ps)" in stderr
    assert PASSWORD not in stderr
    leaks = {k: v for k, v in recorded["env"].items() if PASSWORD in v}
    assert not leaks, leaks
    assert recorded["env"]["AIOELASTIC_STORE_URL"] == "etcd://root@" + etcd.endpoints[0]
    assert recorded["store"] == "ok"


def test_a_wrong_etcd_password_fails_at_once_without_echoing_it(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    code, stderr, _recorded = _run(
        tmp_path,
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        "etcd://root@" + etcd.endpoints[0],
        env={"AIOELASTIC_ETCD_PASSWORD": "not-" + PASSWORD},
    )
    assert code == 1, stderr
    assert "refused our credentials" in stderr, stderr
    assert PASSWORD not in stderr


@pytest.mark.asyncio
async def test_error_text_and_reprs_never_show_a_password() -> None:
    secret = "hunter2-" + uuid.uuid4().hex
    for url in (
        f"bogus://root:{secret}@h:1",
        f"etcd://root:{secret}@h:1/path",
        f"etcd://root:{secret}@",
        f"etcd://root:{secret}@h:1?password={secret}&bogus=1",
    ):
        with pytest.raises((ValueError, TypeError)) as info:
            await open_store(url)
        assert secret not in str(info.value), str(info.value)
        assert "***" in str(info.value) or "bogus" in str(info.value)
    params = RendezvousParameters(
        "etcd", f"etcd://root:{secret}@h:2379", "r", 1, 1, store_url=f"etcd://u:{secret}@h"
    )
    assert secret not in repr(params)
    from aioelastic._secrets import redact_url

    assert (
        redact_url(f"etcd://root:{secret}@a:1,b:2?ca_file=/x")
        == "etcd://root:***@a:1,b:2?ca_file=/x"
    )
    assert redact_url("etcd://root@a:1") == "etcd://root@a:1"
    assert redact_url(f"root:{secret}@h:2379 and more") == "root:***@h:2379 and more"


def test_events_and_logs_redact_passwords(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from aioelastic._secrets import RedactingFilter
    from aioelastic.events import Event, emit

    secret = "hunter2-" + uuid.uuid4().hex
    got: list[Event] = []

    class Sink:
        def emit(self, event: Event) -> None:
            got.append(event)

    emit(Sink(), "agent.rendezvous_retry", error=f"etcd://root:{secret}@h:1 refused", delay=1.0)
    assert secret not in got[0].to_json()
    assert "root:***@h:1" in got[0].to_json()
    log = logging.getLogger("aioelastic.test-redaction")
    log.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, logger="aioelastic.test-redaction"):
        log.info("store at %s", f"etcd://root:{secret}@h:1")
    assert secret not in caplog.text
    assert "root:***@h:1" in caplog.text


def test_run_error_lines_never_show_a_password() -> None:
    secret = "hunter2-" + uuid.uuid4().hex
    for endpoint in (f"root:{secret}@h:99999", f"etcd://root:{secret}@h:99999/x"):
        done = subprocess.run(
            [
                PY,
                "-m",
                "aioelastic",
                "run",
                "--rdzv-backend",
                "etcd",
                "--rdzv-endpoint",
                endpoint,
                "--",
                "true",
            ],
            env=_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0, done
        assert "error" in done.stderr
        assert secret not in done.stderr + done.stdout, done.stderr


@pytest.mark.parametrize("given", [True, False])
def test_status_takes_the_etcd_password_from_a_file(
    tmp_path: Path, etcd: EtcdServer, given: bool
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    env = _env()
    env.pop("AIOELASTIC_ETCD_PASSWORD", None)
    argv = [PY, "-m", "aioelastic", "status", "--endpoint", "etcd://root@" + etcd.endpoints[0]]
    argv += ["--run-id", "nobody", "--json"]
    if given:
        argv += ["--password-file", str(password_file)]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    if given:  # authenticated, and found no such run
        assert "no rendezvous state for run id 'nobody'" in done.stderr, done.stderr
    else:
        assert "needs a password" in done.stderr, done.stderr
        assert "--password-file" in done.stderr


def test_torchrun_plugin_takes_token_file_from_rdzv_conf(
    tmp_path: Path, http_server: ServerThread
) -> None:
    pytest.importorskip("torch")
    from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParameters

    from aioelastic.torchrun import create_torch_handler

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    params = TorchParameters(
        "aioelastic",
        http_server.url,
        uuid.uuid4().hex,
        1,
        1,
        token_file=str(token_file),
        last_call_timeout=0,
    )
    handler = create_torch_handler(params)
    try:
        info = handler.next_rendezvous()
        assert info.world_size == 1
    finally:
        handler.shutdown()
    assert sys.modules.get("aioelastic.torchrun") is not None


@pytest.mark.parametrize("how", ["--token-file", "AIOELASTIC_TOKEN", "none"])
def test_status_takes_the_http_token_from_a_file_or_the_environment(
    tmp_path: Path, http_server: ServerThread, how: str
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    env = _env()
    env.pop("AIOELASTIC_TOKEN", None)
    argv = [PY, "-m", "aioelastic", "status", "--endpoint", http_server.url, "--run-id", "nobody"]
    if how == "--token-file":
        argv += ["--token-file", str(token_file)]
    elif how == "AIOELASTIC_TOKEN":
        env["AIOELASTIC_TOKEN"] = TOKEN
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    if how == "none":
        assert "refused the token" in done.stderr, done.stderr
    else:  # authenticated, and found no such run
        assert "no rendezvous state for run id 'nobody'" in done.stderr, done.stderr
