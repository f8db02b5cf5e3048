"""Structured events: the sinks, and the JSON lines real runs write (rendezvous, timers, agent).

The rendezvous and timer runs use the memory store in virtual time; the agent runs are real
processes (``aioelastic run`` and an in-process :class:`ElasticAgent`) on tiny worker scripts.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.agent import PY, ROOT, WORKER, _env, run_agent

from aioelastic import events
from aioelastic.agent import AgentState, ElasticAgent, WorkerSpec
from aioelastic.errors import RendezvousClosedError
from aioelastic.events import (
    ContextSink,
    Event,
    JsonLinesSink,
    NullSink,
    StreamSink,
    default_sink,
    emit,
    open_sink,
)
from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousParameters
from aioelastic.store import MemoryEngine, MemoryStore
from aioelastic.testing import run_virtual, virtual_time_loop
from aioelastic.timer import StoreTimerClient, StoreTimerServer

pytestmark = pytest.mark.timeout(120)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def kinds(lines: list[dict[str, Any]]) -> list[str]:
    return [line["kind"] for line in lines]


# -- the record and the sinks ---------------------------------------------------------------------


def test_event_line_has_the_common_keys_then_the_fields() -> None:
    event = Event("rendezvous.round_completed", "job", "n1", {"round": 3, "odd": {1, 2}}, 0.5)
    line = json.loads(event.to_json())
    assert line["ts"] == "1970-01-01T00:00:00.500000Z"
    assert line["time"] == 0.5
    assert (line["kind"], line["run_id"], line["node"], line["round"]) == (
        "rendezvous.round_completed",
        "job",
        "n1",
        3,
    )
    assert line["emitter_pid"] == os.getpid()
    assert line["odd"] == "{1, 2}"  # not JSON: written as its str, never an error
    with pytest.raises(ValueError, match="reserved"):
        Event("x", fields={"kind": "y"})
    with pytest.raises(ValueError, match="kind"):
        Event("")


def test_open_sink_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_sink(None), NullSink)
    assert isinstance(open_sink(""), NullSink)
    assert isinstance(open_sink("-"), StreamSink)
    assert isinstance(open_sink("stdout"), StreamSink)
    sink = open_sink(str(tmp_path / "e.jsonl"))
    assert isinstance(sink, JsonLinesSink)
    monkeypatch.delenv(events.EVENTS_ENV, raising=False)
    assert isinstance(default_sink(), NullSink)
    # stateless: one for every component made without a sink (not one object per handler)
    assert default_sink() is default_sink()
    monkeypatch.setenv(events.EVENTS_ENV, str(tmp_path / "env.jsonl"))
    first = default_sink()
    assert isinstance(first, JsonLinesSink)
    assert default_sink() is first  # one per value per process
    emit(first, "test.env", n=1)
    assert kinds(read(tmp_path / "env.jsonl")) == ["test.env"]
    first.close()
    with pytest.raises(TypeError, match="EventSink"):
        events.resolve_sink(object())  # type: ignore[arg-type]


def test_stream_and_context_sinks() -> None:
    stream = io.StringIO()
    sink = ContextSink(StreamSink(stream), run_id="job", node="n1")
    emit(sink, "a.b", x=1)
    emit(sink, "a.c", run_id="other")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["kind"], first["run_id"], first["node"], first["x"]) == ("a.b", "job", "n1", 1)
    assert (second["run_id"], second["node"]) == ("other", "n1")


def test_a_failing_sink_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        calls = 0

        def emit(self, event: Event) -> None:
            self.calls += 1
            raise RuntimeError("disk on fire")

    sink = Broken()
    with caplog.at_level(logging.WARNING, logger="aioelastic.events"):
        for _ in range(3):
            emit(sink, "x.y")
    assert sink.calls == 3
    assert [r.message for r in caplog.records if "failed" in r.message] == [
        f"event sink {sink!r} failed; dropping its failing events"
    ]


def test_unwritable_file_sink_warns_once_and_drops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = JsonLinesSink(tmp_path / "missing-dir" / "e.jsonl")
    with caplog.at_level(logging.WARNING, logger="aioelastic.events"):
        emit(sink, "x.y")
        emit(sink, "x.y")
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1


_WRITER = """
import sys
from aioelastic.events import JsonLinesSink, emit
sink = JsonLinesSink(sys.argv[1])
for i in range(300):
    emit(sink, "test.line", i=i, pad="x" * 2000)
"""


def test_several_processes_append_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    procs = [
        subprocess.Popen([PY, "-c", _WRITER, str(path)], env=_env(), cwd=ROOT) for _ in range(4)
    ]
    for proc in procs:
        assert proc.wait(60) == 0
    lines = read(path)  # every line parses: none was torn or interleaved
    assert len(lines) == 1200
    by_pid: dict[int, list[int]] = {}
    for line in lines:
        by_pid.setdefault(line["emitter_pid"], []).append(line["i"])
    assert sorted(by_pid) == sorted(p.pid for p in procs)
    assert all(seq == list(range(300)) for seq in by_pid.values())


# -- the rendezvous handler ----------------------------------------------------------------------


def test_rendezvous_events_of_a_real_run(tmp_path: Path) -> None:
    path = tmp_path / "rdzv.jsonl"

    async def main() -> None:
        async with asyncio.timeout(3600):
            engine = MemoryEngine()
            sink = JsonLinesSink(path)
            hs = [
                DynamicRendezvousHandler(
                    MemoryStore(engine),
                    "job",
                    2,
                    3,
                    lease_ttl=6.0,
                    last_call_timeout=1.0,
                    event_sink=sink,
                )
                for _ in range(3)
            ]
            await asyncio.gather(*(h.next_rendezvous() for h in hs))
            # a member dies: the others see it
            lost = hs[2]
            assert lost.lease is not None
            await lost.lease.aclose(revoke=False)
            await lost.store.aclose()
            for h in hs[:2]:
                await h.wait_for_change()
            await asyncio.gather(*(h.next_rendezvous() for h in hs[:2]))
            await hs[0].set_closed()
            with pytest.raises(RendezvousClosedError):
                await hs[1].next_rendezvous()
            for h in hs[:2]:
                await h.aclose()
            sink.close()

    run_virtual(main())
    lines = read(path)
    assert {line["run_id"] for line in lines} == {"job"}
    assert all(line["ts"].endswith("Z") and line["node"] for line in lines)
    completed = [x for x in lines if x["kind"] == "rendezvous.round_completed"]
    assert sorted((x["round"], x["rank"]) for x in completed) == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
    ]
    first = completed[0]
    assert first["world_size"] == 3
    assert len(first["participants"]) == 3
    assert first["duration"] == 0  # max_nodes joined at once: no wait (virtual time)
    # the survivors re-form at once (fast_reform): no last call waited out after the loss
    assert all(x["duration"] == 0 for x in completed if x["round"] == 1)
    assert first["master_port"] > 0
    finalized = [x for x in lines if x["kind"] == "rendezvous.round_finalized"]
    assert [(x["round"], x["world_size"]) for x in finalized] == [(0, 3), (1, 2)]
    member_lost = [x for x in lines if x["kind"] == "rendezvous.member_lost"]
    assert len(member_lost) == 2
    assert {x["node"] for x in member_lost} <= set(first["participants"])
    assert all(x["round"] == 0 and x["num_nodes_waiting"] >= 1 for x in member_lost)
    closed = [x for x in lines if x["kind"] == "rendezvous.closed"]
    assert [x["by_this_node"] for x in closed] == [True]
    failed = [x for x in lines if x["kind"] == "rendezvous.join_failed"]
    assert [x["error_type"] for x in failed] == ["RendezvousClosedError"]
    statuses = [(x["previous"], x["status"]) for x in lines if x["kind"] == "rendezvous.status"]
    assert statuses.count(("ACTIVE", "CLOSED")) == 2  # the closer and the node told so
    assert kinds(lines).count("rendezvous.join_started") == 6


def test_member_lost_names_the_dead_member(tmp_path: Path) -> None:
    path = tmp_path / "lost.jsonl"

    async def main() -> None:
        async with asyncio.timeout(3600):
            engine = MemoryEngine()
            sink = JsonLinesSink(path)
            hs = [
                DynamicRendezvousHandler(
                    MemoryStore(engine), "job", 2, 2, lease_ttl=6.0, event_sink=sink
                )
                for _ in range(2)
            ]
            await asyncio.gather(*(h.next_rendezvous() for h in hs))
            assert hs[1].lease is not None
            await hs[1].lease.aclose(revoke=False)
            await hs[1].store.aclose()
            await hs[0].wait_for_change()
            await hs[0].aclose()
            sink.close()
            events_ = [x for x in read(path) if x["kind"] == "rendezvous.member_lost"]
            assert [(x["node"], x["member"]) for x in events_] == [(hs[0].node_id, hs[1].node_id)]

    run_virtual(main())


# -- timers ---------------------------------------------------------------------------------------


def test_store_timer_reap_is_an_event(tmp_path: Path) -> None:
    path = tmp_path / "timers.jsonl"

    async def main() -> None:
        async with asyncio.timeout(60):
            store = MemoryStore()
            sink = ContextSink(JsonLinesSink(path), run_id="job")
            async with StoreTimerServer(
                store, lambda timer: None, prefix="t/", event_sink=sink
            ) as server:
                client = StoreTimerClient(store, "host-a:17", prefix="t/", pid=17)
                await client.acquire("train/step", 2.0)
                await client.acquire("released", 1.0)
                await client.release("released")
                await server.wait_reaped(1)

    with asyncio.Runner(loop_factory=virtual_time_loop) as runner:
        runner.run(main())
    (line,) = read(path)
    assert line["kind"] == "timer.reaped"
    assert (line["run_id"], line["worker"], line["scope"], line["pid"]) == (
        "job",
        "host-a:17",
        "train/step",
        17,
    )
    assert line["server"] == "StoreTimerServer"
    assert 0 <= line["lateness"] < 1.0
    assert line["expiration_time"] > 0
    assert line["error"] is None


# -- the agent ------------------------------------------------------------------------------------


def test_aioelastic_run_events_file(out: Path, tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    proc = subprocess.run(
        [
            PY,
            "-m",
            "aioelastic",
            "run",
            "--standalone",
            "--nproc-per-node=2",
            "--max-restarts=1",
            "--stop-timeout=5",
            f"--events={path}",
            WORKER,
            "fail-once",
            str(out),
        ],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = read(path)
    run_ids = {x["run_id"] for x in lines}
    assert len(run_ids) == 1
    assert None not in run_ids
    order = [k for k in kinds(lines) if k.startswith("agent.") or k.endswith("round_completed")]
    assert order == [
        "rendezvous.round_completed",
        "agent.workers_started",
        "agent.worker_failed",
        "rendezvous.round_completed",
        "agent.workers_started",
        "agent.workers_restarted",
        "agent.finished",
    ]
    by_kind = {x["kind"]: x for x in lines}
    failed = by_kind["agent.worker_failed"]
    assert (failed["round"], failed["rank"], failed["exitcode"]) == (0, 1, 3)
    assert failed["signal"] is None
    restarted = by_kind["agent.workers_restarted"]
    assert (restarted["round"], restarted["restarts"], restarted["max_restarts"]) == (1, 1, 1)
    assert restarted["reason"] == "worker_failed"
    assert 0 < restarted["latency"] < 10
    finished = by_kind["agent.finished"]
    assert (finished["state"], finished["exit_code"], finished["restarts"]) == ("SUCCEEDED", 0, 1)
    started = [x for x in lines if x["kind"] == "agent.workers_started"]
    assert [sorted(x["ranks"]) for x in started] == [[0, 1], [0, 1]]
    assert all(len(x["pids"]) == 2 for x in started)


@pytest.mark.asyncio
async def test_agent_timer_reap_and_metrics_over_loopback(out: Path, tmp_path: Path) -> None:
    """A hung worker is reaped (timer.reaped, agent.worker_reaped with the run id), and the
    agent's /metrics, scraped while the workers run, shows the round, sizes and counters."""
    from aiohttp import ClientSession

    path = tmp_path / "agent.jsonl"
    restarted = asyncio.Event()

    class Tap(JsonLinesSink):
        def emit(self, event: Event) -> None:
            super().emit(event)
            if event.kind == "agent.workers_restarted":
                restarted.set()

    sink = Tap(path)
    spec = WorkerSpec(
        entrypoint=[PY, WORKER, "hang-once", str(out)],
        nproc_per_node=2,
        max_restarts=1,
        stop_timeout=5,
        # the second attempt's workers stay up until scraped: they exited at once, and the
        # scrape then raced their exits (workers_running was 1 now and then)
        env={"PYTHONPATH": str(ROOT), "HOLD_UNTIL": "scraped"},
    )
    params = RendezvousParameters("memory", "", "hang", 1, 1, last_call_timeout=0)
    agent = ElasticAgent(spec, params, event_sink=sink, metrics_port=0)
    scraped: list[str] = []

    async def scrape_when_reaped() -> None:
        # the first attempt is hung until its 0.5 s timer fires; scrape once the restart is up
        await restarted.wait()
        try:
            assert agent.metrics_url is not None
            async with ClientSession() as session, session.get(agent.metrics_url) as response:
                assert response.status == 200
                scraped.append(await response.text())
        finally:
            (out / "scraped").touch()

    async with agent:
        scraper = asyncio.ensure_future(scrape_when_reaped())
        result = await asyncio.wait_for(agent.run(), 60)
        await asyncio.wait_for(scraper, 5)
    sink.close()
    assert result.state is AgentState.SUCCEEDED, result.summary()
    lines = read(path)
    reaped = [x for x in lines if x["kind"] == "timer.reaped"]
    assert len(reaped) == 1
    assert (reaped[0]["run_id"], reaped[0]["scope"], reaped[0]["server"]) == (
        "hang",
        "step",
        "UnixTimerServer",
    )
    assert reaped[0]["node"]
    (failed,) = [x for x in lines if x["kind"] == "agent.worker_failed"]
    assert (failed["reaped_scope"], failed["signal"]) == ("step", "SIGKILL")
    assert "agent.worker_reaped" in kinds(lines)
    # the metrics, as scraped during the second attempt
    text = scraped[0]
    values = _samples(text)
    assert values["aioelastic_agent_rendezvous_round"] == 1
    assert values["aioelastic_agent_world_size"] == 2
    assert values["aioelastic_agent_nodes"] == 1
    assert values["aioelastic_agent_workers_running"] == 2
    assert values["aioelastic_agent_restarts_total"] == 1
    assert values["aioelastic_agent_worker_failures_total"] == 1
    assert values["aioelastic_agent_rendezvous_duration_seconds_count"] == 2
    assert 'aioelastic_agent_info{node="' in text
    assert 'run_id="hang"' in text
    assert agent.metrics_url is None  # closed with the agent


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_port_without_prometheus_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    spec = WorkerSpec(entrypoint=["true"])
    params = RendezvousParameters("memory", "", "x", 1, 1)
    with pytest.raises(ImportError, match=r"aioelastic\[server\]"):
        ElasticAgent(spec, params, metrics_port=0)
    ElasticAgent(spec, params)  # without the flag the agent needs no prometheus-client


def test_cli_metrics_port_without_prometheus_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "prometheus_client.py"
    blocker.write_text("raise ImportError('not installed (test)')\n")
    env = _env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    proc = run_agent("--standalone", "--metrics-port=0", "--no-python", "true", env=env)
    assert proc.returncode == 2
    assert "--metrics-port needs prometheus-client" in proc.stderr
    assert "aioelastic[server]" in proc.stderr
