"""The rendezvous records kept in the store: their key layout, JSON encoding and validation.

Everything a rendezvous writes lives under ``aioelastic/rdzv/<run_id>/``::

    c/round            RoundRecord   the latest completed round (members in rank order), finalised
                                     by compare-and-swap on its mod_revision; never lease-bound
    c/driver           DriverRecord  which node drives the forming round (bound to its lease)
    c/closed           ClosedRecord  present once the run is closed
    n/<round>/<node>   NodeRecord    a node registered for <round> (bound to the node's lease)

and each round's key-value store for its members under ``aioelastic/rdzv-data/<run_id>/<round>/``.

Records are small JSON objects with a schema version ``v`` and a ``kind``. Decoding checks every
field; anything else (corrupt bytes, a foreign writer, a future schema) raises
:class:`~aioelastic.errors.RendezvousStateError` naming the key. Nothing is ever unpickled.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._checks import ID_PATTERN, check_run_id
from ..errors import RendezvousStateError

if TYPE_CHECKING:
    from ..store import Store

__all__ = [
    "ClosedRecord",
    "DriverRecord",
    "NodeRecord",
    "RoundRecord",
    "RunKeys",
    "check_node_id",
    "check_run_id",
    "read_standby_round",
]

SCHEMA_VERSION = 1

_ID = ID_PATTERN
_ID_RE = re.compile(_ID)
_ID_LIST_RE = re.compile(f"{_ID}(?:,{_ID})*")  # ids never contain ','


def check_node_id(node_id: object) -> str:
    """A node id: 1-128 characters of ``A-Z a-z 0-9 _ . : @ -`` (no ``/``)."""
    if not isinstance(node_id, str) or not _ID_RE.fullmatch(node_id):
        raise ValueError(
            f"node_id must be 1-128 characters of letters, digits and '_.:@-', got {node_id!r}"
        )
    return node_id


class RunKeys:
    """The store keys of one run (see the module docstring for the layout)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = check_run_id(run_id)
        self.root = f"aioelastic/rdzv/{run_id}/"
        self.ctl = self.root + "c/"
        self.round = self.ctl + "round"
        self.driver = self.ctl + "driver"
        self.closed = self.ctl + "closed"
        self.nodes = self.root + "n/"
        self.data_root = f"aioelastic/rdzv-data/{run_id}/"

    def nodes_of(self, round_: int) -> str:
        """The prefix of the node records registered for ``round_``."""
        return f"{self.nodes}{round_}/"

    def node(self, round_: int, node_id: str) -> str:
        return f"{self.nodes}{round_}/{node_id}"

    def data(self, round_: int) -> str:
        """The prefix of ``round_``'s key-value store (``RendezvousResult.store``)."""
        return f"{self.data_root}{round_}/"

    def parse_node_key(self, key: str) -> tuple[int, str] | None:
        """``(round, node_id)`` of a node-record key, or None if ``key`` is not one."""
        if not key.startswith(self.nodes):
            return None
        round_text, sep, node_id = key[len(self.nodes) :].partition("/")
        if not sep or not round_text.isdigit() or not node_id:
            return None
        return int(round_text), node_id


# -- decoding helpers ---------------------------------------------------------------------------


def _load(key: str, value: bytes, kind: str) -> dict[str, Any]:
    try:
        obj = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RendezvousStateError(
            f"rendezvous state at {key!r} is not JSON: {value[:60]!r}"
        ) from None
    if not isinstance(obj, dict):
        raise RendezvousStateError(f"rendezvous state at {key!r} is not a JSON object")
    if obj.get("v") != SCHEMA_VERSION or obj.get("kind") != kind:
        raise RendezvousStateError(
            f"rendezvous state at {key!r} is foreign: expected kind {kind!r} schema "
            f"{SCHEMA_VERSION}, got kind {obj.get('kind')!r} schema {obj.get('v')!r}"
        )
    return obj


def _field_int(key: str, obj: dict[str, Any], name: str, minimum: int) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RendezvousStateError(
            f"rendezvous state at {key!r}: field {name!r} must be an int >= {minimum}, "
            f"got {value!r}"
        )
    return value


def _field_str(key: str, obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise RendezvousStateError(
            f"rendezvous state at {key!r}: field {name!r} must be a string, got {value!r}"
        )
    return value


def _field_id(key: str, obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise RendezvousStateError(
            f"rendezvous state at {key!r}: field {name!r} must be a node id, got {value!r}"
        )
    return value


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one, not one per json.dumps call


def _dump(obj: dict[str, Any]) -> bytes:
    return _ENCODER.encode(obj).encode()


# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node registered for a round: its id and the address/port it offers as master."""

    node_id: str
    addr: str
    port: int

    def encode(self) -> bytes:
        return _dump({"v": SCHEMA_VERSION, "kind": "node", "id": self.node_id, "a": self.addr,
                      "p": self.port})  # fmt: skip

    @classmethod
    def decode(cls, key: str, value: bytes) -> NodeRecord:
        obj = _load(key, value, "node")
        record = cls(_field_id(key, obj, "id"), _field_str(key, obj, "a"), 0)
        port = _field_int(key, obj, "p", 0)
        if port > 65535:
            raise RendezvousStateError(f"rendezvous state at {key!r}: port {port} out of range")
        if not key.endswith("/" + record.node_id):
            raise RendezvousStateError(
                f"rendezvous state at {key!r} names another node ({record.node_id!r})"
            )
        return cls(record.node_id, record.addr, port)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """A completed round: its number, its members in rank order and rank 0's master address."""

    round: int
    members: tuple[str, ...]
    master_addr: str
    master_port: int
    # node id -> rank, built on the first rank_of (a record is shared by every task of a
    # process that decodes the same bytes, see decode): not a field of the record
    _ranks: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def rank_of(self, node_id: str) -> int | None:
        """``node_id``'s rank in this round, None if it is not a member (O(1) after the first
        call, so that each of N members finding itself costs O(1), not a scan of N)."""
        ranks = self._ranks
        if not ranks:  # built whole, then added in one C-level update: a thread that shares
            # the record (decode's cache is per process) never sees it half-filled
            ranks.update({node: rank for rank, node in enumerate(self.members)})
        return ranks.get(node_id)

    def encode(self) -> bytes:
        return _dump({"v": SCHEMA_VERSION, "kind": "round", "r": self.round,
                      "m": list(self.members), "ma": self.master_addr,
                      "mp": self.master_port})  # fmt: skip

    @classmethod
    def decode(cls, key: str, value: bytes) -> RoundRecord:
        # Every member decodes the same record when a round completes: in one process (tasks
        # on a memory store share the value's bytes, whose hash Python caches) that is done once.
        return _decode_round(key, value)


@functools.lru_cache(maxsize=8)
def _decode_round(key: str, value: bytes) -> RoundRecord:
    """:meth:`RoundRecord.decode` (errors are raised each time: lru_cache keeps only results)."""
    obj = _load(key, value, "round")
    round_ = _field_int(key, obj, "r", 0)
    raw = obj.get("m")
    members: list[str] = raw if isinstance(raw, list) else []
    try:  # one C-level pass: join refuses non-strings, the regex checks every id
        joined = ",".join(members)
    except TypeError:
        joined = ""
    if not joined or not _ID_LIST_RE.fullmatch(joined) or len(set(members)) != len(members):
        raise RendezvousStateError(
            f"rendezvous state at {key!r}: field 'm' must be a non-empty list of distinct "
            f"node ids, got {str(raw)[:80]}"
        )
    port = _field_int(key, obj, "mp", 0)
    return RoundRecord(round_, tuple(members), _field_str(key, obj, "ma"), port)


@dataclass(frozen=True, slots=True)
class DriverRecord:
    """The node that drives the forming ``round`` (counts arrivals, runs last call, finalises)."""

    round: int
    node_id: str

    def encode(self) -> bytes:
        return _dump({"v": SCHEMA_VERSION, "kind": "driver", "r": self.round, "id": self.node_id})

    @classmethod
    def decode(cls, key: str, value: bytes) -> DriverRecord:
        obj = _load(key, value, "driver")
        return cls(_field_int(key, obj, "r", 0), _field_id(key, obj, "id"))


@dataclass(frozen=True, slots=True)
class ClosedRecord:
    """The run was closed after ``round`` (-1: before any round completed).

    ``reopened``: a later handler with ``reopen_closed`` started a new generation; the close
    still holds for every node of the closed generation (those whose round is ``<= round``).
    """

    round: int
    reopened: bool = False

    def encode(self) -> bytes:
        return _dump(
            {"v": SCHEMA_VERSION, "kind": "closed", "r": self.round, "o": int(self.reopened)}
        )

    @classmethod
    def decode(cls, key: str, value: bytes) -> ClosedRecord:
        obj = _load(key, value, "closed")
        reopened = obj.get("o", 0)
        if reopened not in (0, 1) or isinstance(reopened, float):
            raise RendezvousStateError(
                f"rendezvous state at {key!r}: field 'o' must be 0 or 1, got {reopened!r}"
            )
        return cls(_field_int(key, obj, "r", -1), bool(reopened))


async def read_standby_round(
    store: Store, run_id: str, node_id: str, max_nodes: int
) -> tuple[int, int] | None:
    """``(round, members)`` of the run's latest round when it is full without ``node_id`` (the
    node stands by for the next round), else None.

    One read of the round record (O(1), not the run's every record, as
    :func:`~aioelastic.rendezvous.read_run_status` does); store errors propagate.
    """
    key = RunKeys(run_id).round
    kv = await store.get(key)
    latest = None if kv is None else RoundRecord.decode(key, kv.value)
    if latest is None or len(latest.members) < max_nodes or node_id in latest.members:
        return None
    return latest.round, len(latest.members)
