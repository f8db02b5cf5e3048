"""A store at a glance, as one JSON object: what the web page of ``aioelastic serve`` (``/ui``)
shows and ``GET /v1/ui/snapshot`` returns (documented in ``docs/ui.md``).

:func:`read_overview` gives the runs in the store, one run's status (exactly the object
``aioelastic status --json`` prints: :meth:`RunStatus.to_json
<aioelastic.rendezvous._status.RunStatus.to_json>`, read by the same code) and the locks and
elections with their holders and fencing tokens. :func:`changes` tells what happened between two
overviews (joins, losses, rounds, closes, timers armed, released and reaped, new holders): the
page's list of recent events.

Why a module of its own, here: it reads the records of rendezvous/, timer/ and sync/, so it sits
above them; the store server (in store/, which knows nothing of them, see DESIGN.md's layers)
imports it only when a page or a script first asks for an overview, never at import.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .errors import LeaseNotFoundError, RendezvousNotFoundError, RendezvousStateError
from .rendezvous._state import check_run_id
from .rendezvous._status import read_run_status
from .sync._common import queue_name_of

if TYPE_CHECKING:
    from .store import KeyValue, Store

__all__ = ["OVERVIEW_VERSION", "RDZV_ROOT", "changes", "list_runs", "read_overview"]

#: The schema version of the overview object (its ``v``).
OVERVIEW_VERSION = 1
#: Where every run's rendezvous records live (``aioelastic/rdzv/<run_id>/``).
RDZV_ROOT = "aioelastic/rdzv/"


async def list_runs(store: Store) -> list[str]:
    """The ids of the runs that have rendezvous records in ``store``, sorted."""
    runs: set[str] = set()
    for kv in await store.range(RDZV_ROOT):
        run_id, _, _ = kv.key[len(RDZV_ROOT) :].partition("/")
        try:
            runs.add(check_run_id(run_id))
        except ValueError:
            continue  # not a run's record
    return sorted(runs)


async def _lease_json(store: Store, lease: int) -> tuple[float | None, float | None]:
    try:
        found = await store.lease_time_to_live(lease)
    except LeaseNotFoundError:
        return None, None
    return found.remaining, found.granted_ttl


async def read_queues(store: Store) -> list[dict[str, Any]]:
    """Every lock and election in ``store`` with a holder (its queue's head), by name.

    A whole-keyspace read: the primitives' names are the users' own prefixes, so their entries
    are recognised by their key's form (:func:`~aioelastic.sync._common.queue_name_of`).
    """
    queues: dict[str, list[KeyValue]] = {}
    for kv in await store.range(""):
        name = queue_name_of(kv)
        if name is not None:
            queues.setdefault(name, []).append(kv)
    found: list[dict[str, Any]] = []
    for name in sorted(queues):
        entries = sorted(queues[name], key=lambda kv: kv.create_revision)
        head = entries[0]
        remaining, ttl = await _lease_json(store, head.lease)
        found.append(
            {
                "name": name,
                "holder": head.value.decode("utf-8", "replace"),
                "fencing_token": head.create_revision,
                "key": head.key,
                "lease": head.lease,
                "lease_remaining": remaining,
                "lease_ttl": ttl,
                "waiting": len(entries) - 1,
            }
        )
    return found


async def read_overview(store: Store, run_id: str | None = None) -> dict[str, Any]:
    """The overview of ``store`` (see the module docstring), with ``run_id``'s status.

    ``run_id`` None: the first run (sorted by id), if any. ``run`` is None when the run has no
    records (never started, or all gone) or they are corrupt (``error`` says how). The parts are
    read one after the other, not at one revision; ``revision`` is the store's before the first
    read.
    """
    if run_id is not None:
        check_run_id(run_id)
    revision = await store.current_revision()
    runs = await list_runs(store)
    chosen = run_id if run_id is not None else (runs[0] if runs else None)
    run: dict[str, Any] | None = None
    error: str | None = None
    if chosen is not None:
        try:
            run = (await read_run_status(store, chosen)).to_json()
        except RendezvousNotFoundError:
            run = None
        except RendezvousStateError as exc:  # a foreign or corrupt record: say so, show the rest
            error = str(exc)
    return {
        "v": OVERVIEW_VERSION,
        "revision": revision,
        "time": time.time(),
        "runs": runs,
        "run_id": chosen,
        "run": run,
        "error": error,
        "queues": await read_queues(store),
    }


def _event(kind: str, text: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "text": text, **fields}


def _run_changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[dict[str, Any]]:
    """Joins, losses, rounds and closes between two statuses of one run."""
    events: list[dict[str, Any]] = []
    old_round = None if before is None else before["round"]
    old_members = {} if before is None else {m["node_id"]: m for m in before["members"]}
    if after["round"] is not None and after["round"] != old_round:
        ranks = ", ".join(f"{m['node_id']} (rank {m['rank']})" for m in after["members"])
        events.append(_event("round", f"round {after['round']} formed: {ranks}"))
        for node_id in old_members.keys() - {m["node_id"] for m in after["members"]}:
            if old_members[node_id]["alive"]:
                events.append(_event("left", f"{node_id} is not in round {after['round']}"))
    else:
        for member in after["members"]:
            old = old_members.get(member["node_id"])
            if old is not None and old["alive"] and not member["alive"]:
                events.append(_event("lost", f"{member['node_id']} (rank {member['rank']}) lost"))
    old_nodes = set() if before is None else {n["node_id"] for n in _nodes(before)}
    for node in _nodes(after):
        if node["node_id"] not in old_nodes:
            events.append(_event("join", f"{node['node_id']} joins round {after['forming_round']}"))
    if after["closed"] and (before is None or not before["closed"]):
        events.append(_event("closed", f"run closed after round {after['closed_after_round']}"))
    if after["reopened"] and before is not None and before["closed"]:
        events.append(_event("reopened", "run reopened"))
    return events


def _nodes(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [*status["waiting"], *status["standby"]]


def _timer_changes(
    before: dict[str, Any] | None, after: dict[str, Any], elapsed: float
) -> list[dict[str, Any]]:
    """Timers armed, released and reaped (gone after their deadline) between two statuses."""
    old = {} if before is None else {t["key"]: t for t in before["timers"]}
    new = {t["key"]: t for t in after["timers"]}
    events: list[dict[str, Any]] = []
    for key in sorted(new.keys() - old.keys()):
        t = new[key]
        events.append(_event("timer", f"timer {t['scope_id']} of {t['worker_id']} armed"))
    for key in sorted(old.keys() - new.keys()):
        t = old[key]
        if t["time_left"] - elapsed <= 0:
            text = f"timer {t['scope_id']} of {t['worker_id']} expired: reaped"
            events.append(_event("reaped", text))
        else:
            events.append(_event("timer", f"timer {t['scope_id']} of {t['worker_id']} released"))
    return events


def _queue_changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[dict[str, Any]]:
    old = {} if before is None else {q["name"]: q for q in before["queues"]}
    events: list[dict[str, Any]] = []
    for queue in after["queues"]:
        previous = old.get(queue["name"])
        if previous is None or previous["fencing_token"] != queue["fencing_token"]:
            text = f"{queue['name']}: held by {queue['holder']} (token {queue['fencing_token']})"
            events.append(_event("holder", text))
    for name in sorted(old.keys() - {q["name"] for q in after["queues"]}):
        events.append(_event("holder", f"{name}: released, nobody holds it"))
    return events


def changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[dict[str, Any]]:
    """What happened between overview ``before`` (None: nothing seen yet) and ``after``, oldest
    kind first: each ``{"kind", "text", "time", "revision", "run_id"}`` (``kind`` one of
    ``round``, ``left``, ``lost``, ``join``, ``closed``, ``reopened``, ``timer``, ``reaped``,
    ``holder``, ``run``)."""
    if before is None:
        return []
    events: list[dict[str, Any]] = []
    for run_id in sorted(set(after["runs"]) - set(before["runs"])):
        events.append(_event("run", f"run {run_id} appeared"))
    for run_id in sorted(set(before["runs"]) - set(after["runs"])):
        events.append(_event("run", f"run {run_id} is gone from the store"))
    if after["run"] is not None:
        # a run followed now, none before (the stream picked the first run): all of it is news
        old_run = before["run"] if before["run_id"] == after["run_id"] else None
        events += _run_changes(old_run, after["run"])
        events += _timer_changes(old_run, after["run"], after["time"] - before["time"])
    events += _queue_changes(before, after)
    for event in events:
        event.update(time=after["time"], revision=after["revision"], run_id=after["run_id"])
    return events
