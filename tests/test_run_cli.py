"""``aioelastic run``'s command line: torchrun's flags and environment, and usage errors that
exit 2 with ``run``'s usage line and the offending flag before anything starts."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import free_port
from helpers.agent import PY, ROOT, _env
from helpers.agent import run_agent as _run
from helpers.waiting import until_file_sync

from aioelastic import cli
from aioelastic.agent import _cli

pytestmark = pytest.mark.timeout(120)

# prints one JSON line of the worker's environment; no .py suffix on purpose
SCRIPT = """\
import json, os, signal, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES")
# one write per line: the workers share the agent's stdout, and print()'s text and newline are
# two writes when the stream is unbuffered (two workers' lines then interleave)
sys.stdout.write(json.dumps({k: os.environ.get(k) for k in keys}) + "\\n")
sys.stdout.flush()
print("stderr of", os.environ["LOCAL_RANK"], file=sys.stderr, flush=True)
if len(sys.argv) > 1:  # wait for a signal, record it
    def got(signum, frame):
        with open(sys.argv[1], "a") as f:
            f.write(signal.Signals(signum).name + "\\n")
        sys.exit(0)
    for s in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(s, got)
    with open(sys.argv[1] + ".up", "a") as f:
        f.write("up\\n")
    signal.pause()  # until the signal: its handler records it and exits
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "show_env"
    path.write_text(SCRIPT)
    return path


def _envs(stdout: str) -> list[dict[str, str | None]]:
    found = []
    for line in stdout.splitlines():
        line = line.partition("]: ")[2] if line.startswith("[rank") else line
        if line.startswith("{"):
            found.append(json.loads(line))
    return sorted(found, key=lambda e: int(e["RANK"] or 0))


# -- usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag", "says"),
    [
        (["--bogus", "1", "x.py"], "unrecognized arguments: --bogus", ""),
        (["--max-restarts", "-1", "x.py"], "--max-restarts", ">= 0"),
        (["--stop-timeout", "-1", "x.py"], "--stop-timeout", ">= 0"),
        (["--rdzv-backend", "bogus", "x.py"], "--rdzv-backend", "use one of"),
        (["--rdzv-conf", "garbage", "x.py"], "--rdzv-conf", "key=value"),
        (["--rdzv-conf", "last_call_timeout=abc", "x.py"], "--rdzv-conf", "last_call_timeout=abc"),
        (["--rdzv-conf", "join_timeout=-3", "x.py"], "--rdzv-conf", "join_timeout"),
        (["--standalone", "--nnodes", "2", "x.py"], "--standalone", "--rdzv-endpoint"),
        (["--nnodes", "1:3", "x.py"], "--rdzv-endpoint", "elastic"),
        (
            ["--rdzv-backend", "static", "--nnodes", "2", "--node-rank", "2", "x.py"],
            "--node-rank",
            "0..1",
        ),
        (["--events", "/nonexistent-dir/events.jsonl", "x.py"], "--events", "cannot write"),
        (["--local-ranks-filter", "0,x", "x.py"], "--local-ranks-filter", "integers"),
        (
            ["--nproc-per-node", "2", "--local-ranks-filter", "2", "x.py"],
            "--local-ranks-filter",
            "0..1",
        ),
        (["--signals-to-handle", "SIGNOPE", "x.py"], "--signals-to-handle", "SIGNOPE"),
        (["--event-log-handler", "dynamic_rendezvous", "x.py"], "--event-log-handler", "--events"),
        (["--no-python", "-m", "pkg"], "--no-python", "--module"),
        (["--master-port", "70000", "x.py"], "--master-port", "1..65535"),
        (["--rdzv-backend", "memory", "--rdzv-id", "job/1", "x.py"], "--rdzv-id", "no '/'"),
    ],
)
def test_usage_errors_exit_2_with_runs_usage_and_the_flag(
    args: list[str], flag: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code: object
    try:
        code = cli.main(["run", *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("usage: aioelastic run"), err
    assert f"aioelastic run: error: {flag}" in err, err
    assert says in err
    assert "Error:" not in err  # no Python exception name
    assert "starting" not in err  # nothing started


def test_usage_errors_from_the_command_line(tmp_path: Path) -> None:
    proc = _run("--bogus", "1", "x.py")
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: aioelastic run")
    assert "unrecognized arguments: --bogus" in proc.stderr
    proc = _run("--rdzv-backend", "bogus", "x.py")
    assert proc.returncode == 2
    assert "--rdzv-backend: 'bogus' is not a rendezvous backend" in proc.stderr
    assert "starting" not in proc.stderr


def test_a_malformed_pet_variable_is_a_usage_error_naming_it() -> None:
    proc = _run("x.py", env={"PET_MAX_RESTARTS": "many"})
    assert proc.returncode == 2
    assert "PET_MAX_RESTARTS='many'" in proc.stderr
    proc = _run("x.py", env={"PET_STANDALONE": "maybe"})
    assert proc.returncode == 2
    assert "PET_STANDALONE='maybe'" in proc.stderr


def test_nproc_gpu_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert cli.main(["run", "--nproc-per-node", "gpu", "x.py"]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


# -- torchrun's environment -------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _cli.configure(parser)
    return parser.parse_args(argv)


def test_flags_default_from_pet_variables_and_argv_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "2")
    monkeypatch.setenv("PET_STANDALONE", "1")
    monkeypatch.setenv("PET_RDZV_CONF", "join_timeout=5")
    args = _parse(["x.py"])
    assert (args.nproc_per_node, args.max_restarts, args.standalone) == ("3", 2, True)
    assert args.rdzv_conf == "join_timeout=5"
    assert _parse(["--max-restarts", "4", "x.py"]).max_restarts == 4


def test_shutdown_timeout_alias_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parse(["x.py"]).stop_timeout == 30.0
    assert _parse(["--shutdown-timeout", "7", "x.py"]).stop_timeout == 7.0
    assert _parse(["--shutdown_timeout", "8", "x.py"]).stop_timeout == 8.0
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9")
    assert _parse(["x.py"]).stop_timeout == 9.0
    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "10")
    assert _parse(["x.py"]).stop_timeout == 10.0
    assert _parse(["--stop-timeout", "11", "x.py"]).stop_timeout == 11.0


# -- torchrun's flags, end to end -------------------------------------------------------------


def test_a_script_without_py_runs_with_python_from_pet_variables(script: Path) -> None:
    proc = _run(str(script), env={"PET_NPROC_PER_NODE": "2"})
    assert proc.returncode == 0, proc.stderr
    envs = _envs(proc.stdout)
    assert [e["RANK"] for e in envs] == ["0", "1"]


def test_local_ranks_filter_and_virtual_local_rank(script: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = _run(
        "--nproc-per-node=2",
        "--local-ranks-filter=1",
        "--virtual-local-rank",
        "--tee=3",
        f"--log-dir={logs}",
        str(script),
        env={"CUDA_VISIBLE_DEVICES": "4,5"},
    )
    assert proc.returncode == 0, proc.stderr
    envs = _envs(proc.stdout)
    assert [(e["RANK"], e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == [
        ("1", "0", "5")
    ]  # only local rank 1 on the console
    assert "stderr of 0" in proc.stderr  # LOCAL_RANK is 0 for both...
    assert proc.stderr.count("stderr of 0") == 1  # ...but rank 0's stream is not shown
    assert "[rank0]" not in proc.stdout + proc.stderr
    files = sorted(p.parent.name for p in logs.rglob("stdout.log"))
    assert files == ["0", "1"]  # the filtered rank's files are still written
    rank0 = next(p for p in logs.rglob("stdout.log") if p.parent.name == "0")
    assert '"RANK": "0"' in rank0.read_text()


def test_signals_to_handle_forwards_the_signal(script: Path, tmp_path: Path) -> None:
    record = tmp_path / "signals"
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "aioelastic",
            "run",
            "--signals-to-handle=SIGUSR1,SIGTERM",
            str(script),
            str(record),
        ],
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        up = Path(f"{record}.up")
        until_file_sync(up.parent, up.exists, 30, "the worker did not start")
        proc.send_signal(signal.SIGUSR1)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGUSR1, err
    assert record.read_text().split() == ["SIGUSR1"]
    assert "stopped by SIGUSR1" in err


def test_static_backend_with_node_rank_and_master_port(script: Path) -> None:
    port = free_port()
    common = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={port}", str(script)]
    nodes = [
        subprocess.Popen(
            [PY, "-m", "aioelastic", "run", f"--node-rank={rank}", *common],
            env=_env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (1, 0)  # rank 1 first: it waits until rank 0's store answers
    ]
    results = [node.communicate(timeout=60) for node in nodes]
    for node, (_out, err) in zip(nodes, results, strict=True):
        assert node.returncode == 0, err
    assert "serving the rendezvous store at http://127.0.0.1:" in results[1][1]
    envs = _envs(results[0][0]) + _envs(results[1][0])
    assert sorted((e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in envs) == [
        ("0", "0", "2"),
        ("1", "1", "2"),
    ]
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
