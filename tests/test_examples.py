"""The examples the docs include run as written and print what the docs say (docs move with
code). Each runs in a subprocess with this checkout first on the path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT

EXAMPLES = ROOT / "examples"


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def test_getting_started() -> None:
    out = run(str(EXAMPLES / "getting_started.py")).stdout
    assert "swap applied: True" in out
    assert "event: PUT nodes/a\nevent: DELETE nodes/a" in out
    assert re.findall(r"round 0: rank (\d) of 3", out) == ["0", "1", "2"]
    # the page shows the whole output, first line included
    page = (ROOT / "docs" / "getting-started.md").read_text()
    shown = page.split("It prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert shown.splitlines() == out.splitlines()


def test_rendezvous_service_demo() -> None:
    out = run(str(EXAMPLES / "rendezvous_service.py"), timeout=60).stdout
    formed, _, reformed = out.partition("one stopped; the other two re-formed:")
    assert sorted(re.findall(r"rank (\d) of 3 \(round 0\)", formed)) == ["0", "1", "2"]
    assert sorted(re.findall(r"rank (\d) of 2 \(round 1\)", reformed)) == ["0", "1"]
    assert "last event seen: PARTICIPANT_LOST" in out


def test_run_a_job_with_a_restart() -> None:
    done = run(
        "-m", "aioelastic", "run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
        "examples/flaky_worker.py",
    )  # fmt: skip
    assert sorted(re.findall(r"rank (\d)/2: ok in round 1 after 1 restart\(s\)", done.stdout)) == [
        "0",
        "1",
    ]
    assert "rank 1: failing on purpose (attempt 0)" in done.stderr


def test_run_a_job_without_restarts_fails_and_says_why() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "aioelastic", "run", "--standalone", "--nproc-per-node", "2",
         "examples/flaky_worker.py"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "exit code 3" in done.stderr


def test_the_test_kit_example_suite_passes() -> None:
    out = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/testing").stdout
    assert re.search(r"\b(\d+) passed", out), out
    assert "failed" not in out
    assert "skipped" not in out


def test_the_store_backend_example_passes_the_conformance_suite() -> None:
    """docs/howto/store-backend.md: the example backend runs every conformance test, none
    skipped (it declares every optional feature), and opens by its URL scheme."""
    out = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/store_backend").stdout
    assert re.search(r"\b(\d+) passed", out), out
    assert "failed" not in out
    assert "skipped" not in out


@pytest.mark.etcd
def test_etcd_cluster_with_tls_and_auth() -> None:
    from aioelastic.etcd_server import find_etcd_binary
    from aioelastic.testing.etcd import skip_without_etcd

    if shutil.which("openssl") is None:
        pytest.skip("the example makes its certificates with openssl")
    try:
        find_etcd_binary()
    except FileNotFoundError as exc:
        skip_without_etcd(str(exc))
    out = run(str(EXAMPLES / "etcd_tls_cluster.py"), timeout=180).stdout
    assert re.search(r"cluster: etcds://(127\.0\.0\.1:\d+,?){3}", out), out
    assert "rendezvous (rank, world size): [(0, 2), (1, 2)]" in out
    assert "killed; read back: hello over TLS" in out
