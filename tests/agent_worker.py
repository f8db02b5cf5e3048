"""A worker for the agent tests: ``agent_worker.py MODE OUT_DIR``.

Every start appends one JSON line (its env, pid, start time) to ``OUT_DIR/starts.jsonl``; a
SIGTERM from before that line on appends one to ``OUT_DIR/terms.jsonl`` and ends the worker with
exit 0. Then the mode decides what it does:

- ``ok``: exit 0.
- ``fail-once``: rank 1 exits 3 on the first attempt; the others wait to be stopped; exit 0 after.
- ``fail-always``: rank 1 exits 3; the others wait to be stopped.
- ``hang-once``: rank 0 arms a 0.5 s watchdog timer on the agent's server and hangs (first
  attempt only); the others wait to be stopped; exit 0 after (once ``OUT_DIR/$HOLD_UNTIL``
  exists, if that variable is set: a test that looks at the running workers says when).
- ``elastic``: wait while WORLD_SIZE is 4 (or no ``OUT_DIR/shrink`` marker exists); exit 0 in a
  smaller world once the marker exists.
- ``grow``: wait while WORLD_SIZE is below 4; exit 0 at 4.
- ``sleep``: wait to be stopped (SIGTERM), recording that it was.
- ``fragile``: while WORLD_SIZE is 4, fail (exit 1, as a collective does when a peer's connection
  closes) once ``OUT_DIR/killed`` exists; exit 0 in a smaller world.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def record(out: str, name: str, **extra: object) -> None:
    line = {
        "pid": os.getpid(),
        "time": time.time(),
        **{k: os.environ.get(k) for k in _KEYS},
        **extra,
    }
    with open(os.path.join(out, name), "a") as f:
        f.write(json.dumps(line) + "\n")


_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "AIOELASTIC_TIMER_SOCKET",
    "AIOELASTIC_ROUND",
)


def record_terms(out: str) -> None:
    """From now on a SIGTERM is recorded in ``terms.jsonl`` and the worker exits 0."""

    def on_term(signum: int, frame: object) -> None:
        record(out, "terms.jsonl")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)


def wait_forever(out: str) -> None:
    while True:
        signal.pause()  # until a signal: SIGTERM's handler (record_terms) exits


def hold(out: str) -> None:
    """Stay up until ``OUT_DIR/$HOLD_UNTIL`` exists (at once without ``HOLD_UNTIL``)."""
    name = os.environ.get("HOLD_UNTIL")
    if name:
        from helpers.waiting import until_file_sync  # (this script's folder is on sys.path)

        marker = os.path.join(out, name)
        until_file_sync(Path(out), lambda: os.path.exists(marker), 60, f"no {name}")


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    # before the start record: a test that has seen the start may stop the worker at once (it
    # raced the handler's installation in wait_forever, and a SIGTERM went unrecorded)
    record_terms(out)
    record(out, "starts.jsonl")
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if mode == "ok":
        return
    if mode in ("fail-once", "fail-always"):
        if mode == "fail-always" or attempt == 0:
            if rank == 1:
                time.sleep(0.2)  # deliberate: the failure comes after the group is up and running
                print("rank 1 fails on purpose", file=sys.stderr, flush=True)
                record(out, "failures.jsonl")
                sys.exit(3)
            wait_forever(out)
        return
    if mode == "hang-once":
        if attempt == 0:
            if rank == 0:
                from aioelastic.agent.worker import blocking_timer_client

                client = blocking_timer_client()
                client.acquire("step", 0.5)
                record(out, "failures.jsonl")
                time.sleep(60)  # hangs: the agent's timer server kills this process
                sys.exit(0)
            wait_forever(out)
        hold(out)
        return
    if mode == "elastic":
        if os.environ["WORLD_SIZE"] != "4" and os.path.exists(os.path.join(out, "shrink")):
            return
        wait_forever(out)
    if mode == "grow":
        if os.environ["WORLD_SIZE"] == "4":
            return
        wait_forever(out)
    if mode == "fragile":
        if os.environ["WORLD_SIZE"] != "4":
            return
        from helpers.waiting import until_file_sync  # (this script's folder is on sys.path)

        killed = os.path.join(out, "killed")
        until_file_sync(Path(out), lambda: os.path.exists(killed), 3600, "no peer was killed")
        print("Connection closed by peer", file=sys.stderr, flush=True)
        sys.exit(1)
    if mode == "sleep":
        wait_forever(out)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
