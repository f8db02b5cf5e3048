"""The rendezvous records kept in the store: their key layout, JSON encoding and validation.

Everything a rendezvous writes lives under ``aioelastic/rdzv/<run_id>/``::

    c/round            RoundRecord   the latest completed round: its number, world size, rank 0's
                                     address, how many roster chunks it has and how many members
                                     of the round before are not in it (no member list:
                                     every node watches c/), finalised by compare-and-swap on its
                                     mod_revision; never lease-bound
    c/driver           DriverRecord  which node drives the forming round (bound to its lease)
    c/closed           ClosedRecord  present once the run is closed
    n/<round>/<node>   NodeRecord    a node registered for <round> (bound to the node's lease)
    r/<round>/<i>      RosterChunk   the members of <round> of ranks i x ROSTER_CHUNK and on, in
                                     rank order: the roster, which the driver, tools and
                                     ``participants`` read (a member reads its member record)
    m/<round>/<node>   MemberRecord  a member of <round> and its rank (bound to the member's
                                     lease; written by the driver): its own get tells a node its
                                     rank, and its deletion is a loss for the others
    m/<round>/~due     DueRecord     a next round is forming that would change <round> (written
                                     by that round's driver): NODES_WAITING for its members
    m/<round>/~closed  ClosedRecord  the run was closed after <round> (with ``c/closed``)
    m/<round>/~next    RoundRecord   the next round completed (written with it)

The members of a round watch ``m/<round>/`` only: what a member's re-registration writes (under
``n/``) reaches the driver alone, so N members rejoining cost O(N), not N events each.

and each round's key-value store for its members under ``aioelastic/rdzv-data/<run_id>/<round>/``.

Records are small JSON objects with a schema version ``v`` and a ``kind``. Decoding checks every
field; anything else (corrupt bytes, a foreign writer, a future schema) raises
:class:`~aioelastic.errors.RendezvousStateError` naming the key. Nothing is ever unpickled.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from .._checks import ID_PATTERN, check_run_id
from ..errors import RendezvousStateError

if TYPE_CHECKING:
    from ..store import KeyValue, Store
    from .api import RendezvousResult

__all__ = [
    "ClosedRecord",
    "DriverRecord",
    "DueRecord",
    "MemberRecord",
    "NodeRecord",
    "RosterChunk",
    "RoundRecord",
    "RunKeys",
    "check_node_id",
    "check_run_id",
    "read_standby_round",
]

SCHEMA_VERSION = 1
#: the round record's: schema 1 listed every member in it (sent to every node of the run)
ROUND_SCHEMA_VERSION = 2
#: members per roster chunk (about 13 KB with 12-character ids)
ROSTER_CHUNK = 1024

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
        self.roster = self.root + "r/"
        self.members = self.root + "m/"
        self.data_root = f"aioelastic/rdzv-data/{run_id}/"

    def nodes_of(self, round_: int) -> str:
        """The prefix of the node records registered for ``round_``."""
        return f"{self.nodes}{round_}/"

    def node(self, round_: int, node_id: str) -> str:
        return f"{self.nodes}{round_}/{node_id}"

    def roster_of(self, round_: int) -> str:
        """The prefix of ``round_``'s roster chunks."""
        return f"{self.roster}{round_}/"

    def chunk(self, round_: int, index: int) -> str:
        return f"{self.roster}{round_}/{index}"

    def members_of(self, round_: int) -> str:
        """The prefix a member of ``round_`` watches (its members' records and markers)."""
        return f"{self.members}{round_}/"

    def member(self, round_: int, node_id: str) -> str:
        return f"{self.members}{round_}/{node_id}"

    def due(self, round_: int) -> str:
        return f"{self.members}{round_}/~due"

    def closed_marker(self, round_: int) -> str:
        return f"{self.members}{round_}/~closed"

    def next_marker(self, round_: int) -> str:
        return f"{self.members}{round_}/~next"

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


def _load(key: str, value: bytes, kind: str, version: int = SCHEMA_VERSION) -> dict[str, Any]:
    try:
        obj = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RendezvousStateError(
            f"rendezvous state at {key!r} is not JSON: {value[:60]!r}"
        ) from None
    if not isinstance(obj, dict):
        raise RendezvousStateError(f"rendezvous state at {key!r} is not a JSON object")
    if obj.get("v") != version or obj.get("kind") != kind:
        raise RendezvousStateError(
            f"rendezvous state at {key!r} is foreign: expected kind {kind!r} schema "
            f"{version}, got kind {obj.get('kind')!r} schema {obj.get('v')!r}"
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


#: a JSON string literal, as ``_ENCODER`` writes it (ASCII, escaped): the records a join writes
#: every round are formatted with it directly, byte for byte what ``_dump`` gives for them, without
#: the encoder's Python layer and its dict (a few microseconds a record, several records a join)
_str = encode_basestring_ascii


# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node registered for a round: its id and the address/port it offers as master."""

    node_id: str
    addr: str
    port: int

    def encode(self) -> bytes:
        return (
            f'{{"v":{SCHEMA_VERSION},"kind":"node","id":{_str(self.node_id)},'
            f'"a":{_str(self.addr)},"p":{self.port:d}}}'
        ).encode()

    @classmethod
    def decode(cls, key: str, value: bytes) -> NodeRecord:
        obj = _load(key, value, "node")
        node_id, addr = _field_id(key, obj, "id"), _field_str(key, obj, "a")
        port = _field_int(key, obj, "p", 0)
        if port > 65535:
            raise RendezvousStateError(f"rendezvous state at {key!r}: port {port} out of range")
        if not key.endswith("/" + node_id):
            raise RendezvousStateError(
                f"rendezvous state at {key!r} names another node ({node_id!r})"
            )
        return cls(node_id, addr, port)  # (one record: the driver decodes every registration)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """A completed round: its number, world size, rank 0's master address, and how many chunks
    its roster has (``chunks``: the members are in ``r/<round>/0 .. chunks-1``; 0 for a static
    round, whose members are ``rank0 .. rank<world_size - 1>``).

    Every node of the run watches ``c/`` and receives this record: it is O(1) bytes, so a round
    of N costs N small events, not N copies of an N-member list. ``departed``: how many members
    of the round before (``round - 1``) are not in this one (0 for a first round; None where the
    record does not say: a static round, or one written by an older version), so that a member
    knows whether the round lost a node without reading two rosters. ``departed == 0`` also
    says that each member of the round before kept its rank (:func:`kept_rank`): such a member
    knows its rank from this record alone, without a read.
    """

    round: int
    world_size: int
    master_addr: str
    master_port: int
    chunks: int
    departed: int | None = None

    def encode(self) -> bytes:
        obj = {"v": ROUND_SCHEMA_VERSION, "kind": "round", "r": self.round, "w": self.world_size,
               "ma": self.master_addr, "mp": self.master_port, "c": self.chunks}  # fmt: skip
        if self.departed is not None:
            obj["d"] = self.departed
        return _dump(obj)

    @classmethod
    def decode(cls, key: str, value: bytes) -> RoundRecord:
        # every node of a process (thousands in one, on a memory store) decodes the same event
        return _decode_round(key, value)


@functools.lru_cache(maxsize=64)
def _decode_round(key: str, value: bytes) -> RoundRecord:
    obj = _load(key, value, "round", ROUND_SCHEMA_VERSION)
    record = RoundRecord(
        _field_int(key, obj, "r", 0),
        _field_int(key, obj, "w", 1),
        _field_str(key, obj, "ma"),
        _field_int(key, obj, "mp", 0),
        _field_int(key, obj, "c", 0),
        None if "d" not in obj else _field_int(key, obj, "d", 0),  # absent: an older writer's
    )
    if record.chunks > record.world_size:
        raise RendezvousStateError(
            f"rendezvous state at {key!r}: {record.chunks} roster chunks for "
            f"{record.world_size} members"
        )
    return record


@dataclass(frozen=True, slots=True)
class RosterChunk:
    """Members of a round in rank order, from rank ``first`` on (``r/<round>/<i>``): one
    string of ids joined by ``,`` (ids have none), about 13 bytes a member with 12-character
    ids."""

    first: int
    members: tuple[str, ...]

    def encode(self) -> bytes:
        return _dump({"v": SCHEMA_VERSION, "kind": "roster", "k": self.first,
                      "m": ",".join(self.members)})  # fmt: skip

    @classmethod
    def decode(cls, key: str, value: bytes) -> RosterChunk:
        # whoever reads the roster in a process reads the same bytes: decoded once
        return _decode_chunk(key, value)


@functools.lru_cache(maxsize=64)
def _decode_chunk(key: str, value: bytes) -> RosterChunk:
    obj = _load(key, value, "roster")
    first = _field_int(key, obj, "k", 0)
    members = obj.get("m")
    if not isinstance(members, str) or not _ID_LIST_RE.fullmatch(members):
        raise RendezvousStateError(
            f"rendezvous state at {key!r}: field 'm' must be node ids joined by ',', got "
            f"{str(members)[:80]!r}"
        )
    return RosterChunk(first, tuple(members.split(",")))


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A member of a round and its rank (``m/<round>/<node>``, bound to the member's lease)."""

    rank: int

    def encode(self) -> bytes:
        return f'{{"v":{SCHEMA_VERSION},"kind":"member","k":{self.rank:d}}}'.encode()

    @classmethod
    def decode(cls, key: str, value: bytes) -> MemberRecord:
        return cls(_field_int(key, _load(key, value, "member"), "k", 0))


@dataclass(frozen=True, slots=True)
class DueRecord:
    """A next round is forming that would change the round (``m/<round>/~due``): ``node_id``
    registered for it, ``waiting`` nodes have, ``restart``: a member of the round has (the
    round restarts, full or not)."""

    node_id: str
    waiting: int
    restart: bool

    def encode(self) -> bytes:
        return (
            f'{{"v":{SCHEMA_VERSION},"kind":"due","id":{_str(self.node_id)},'
            f'"n":{self.waiting:d},"s":{int(self.restart):d}}}'
        ).encode()

    @classmethod
    def decode(cls, key: str, value: bytes) -> DueRecord:
        return _decode_due(key, value)  # (the same event to every member: as RoundRecord's)


@functools.lru_cache(maxsize=64)
def _decode_due(key: str, value: bytes) -> DueRecord:
    obj = _load(key, value, "due")
    restart = _field_int(key, obj, "s", 0)
    return DueRecord(_field_id(key, obj, "id"), _field_int(key, obj, "n", 0), restart > 0)


def roster_chunks(members: Sequence[str]) -> list[RosterChunk]:
    """The chunks of a round whose members are ``members`` in rank order."""
    return [
        RosterChunk(first, tuple(members[first : first + ROSTER_CHUNK]))
        for first in range(0, len(members), ROSTER_CHUNK)
    ]


def static_members(world_size: int) -> tuple[str, ...]:
    """The members of a static round: ``rank0 .. rank<world_size - 1>``."""
    return tuple(f"rank{rank}" for rank in range(world_size))


def roster_members(keys: RunKeys, record: RoundRecord, kvs: Iterable[KeyValue]) -> tuple[str, ...]:
    """The members of ``record``'s round in rank order, from its roster chunks among ``kvs``
    (other keys are skipped); RendezvousStateError unless each rank is there exactly once."""
    if record.chunks == 0:
        return static_members(record.world_size)
    prefix = keys.roster_of(record.round)
    slots: list[str | None] = [None] * record.world_size
    seen: set[str] = set()
    for kv in kvs:
        if not kv.key.startswith(prefix):
            continue
        index = kv.key[len(prefix) :]
        if not index.isdigit() or int(index) >= record.chunks:
            raise RendezvousStateError(f"rendezvous state at {kv.key!r}: not a roster chunk")
        chunk = RosterChunk.decode(kv.key, kv.value)
        end = chunk.first + len(chunk.members)
        if end > record.world_size or any(slots[chunk.first : end]):
            raise RendezvousStateError(
                f"rendezvous state at {kv.key!r}: ranks {chunk.first}-{end - 1} are out of "
                f"range or taken twice"
            )
        slots[chunk.first : end] = chunk.members
        seen.update(chunk.members)
    if len(seen) != record.world_size or None in slots:
        raise RendezvousStateError(
            f"rendezvous state under {prefix!r}: {len(seen)} distinct ids for the round's "
            f"{record.world_size} ranks in its roster"
        )
    return tuple(node for node in slots if node is not None)


async def read_roster(
    store: Store, keys: RunKeys, record: RoundRecord, last: RendezvousResult | None = None
) -> tuple[str, ...]:
    """The members of ``record``'s round in rank order: ``last``'s if they are the same
    (:func:`kept_roster`: no read), else one range of its roster (O(N)).

    ``()`` when the roster is gone: a later round completed since (its driver deleted it), so
    whoever asks is not in that later round's view yet; what it read was superseded."""
    if record.chunks == 0:
        return static_members(record.world_size)
    kept = kept_roster(record, last)
    if kept is not None:
        return kept
    result = await store.range(keys.roster_of(record.round))
    if not result.kvs:
        return ()
    return roster_members(keys, record, result.kvs)


def kept_rank(record: RoundRecord, last: RendezvousResult | None) -> int | None:
    """The rank a node keeps in ``record``'s round, known without a read: ``last`` is its last
    completed round's result; when that is the round right before and the record says none of
    that round's members departed (``departed == 0``), every one of them is in this round at
    its old rank (:func:`~._driver.assign_ranks` keeps a member's rank below the new world size,
    which is at least the old one then). None: not known (a read is)."""
    if last is None or record.departed != 0 or last.round != record.round - 1:
        return None
    return last.rank


def kept_roster(record: RoundRecord, last: RendezvousResult | None) -> tuple[str, ...] | None:
    """``record``'s roster when it is ``last``'s (:func:`kept_rank`, and the round is as large
    as the one before: the same members at the same ranks), known without a read; else None."""
    if kept_rank(record, last) is None:
        return None
    assert last is not None
    return last.participants if len(last.participants) == record.world_size else None


async def read_rank(
    store: Store,
    keys: RunKeys,
    record: RoundRecord,
    node_id: str,
    last: RendezvousResult | None = None,
) -> int | None:
    """``node_id``'s rank in ``record``'s round, None if it is not a member: the rank it kept
    from its ``last`` round (:func:`kept_rank`: no read), else one get of its member record
    (O(1) bytes)."""
    if record.chunks == 0:
        members = static_members(record.world_size)
        return members.index(node_id) if node_id in members else None
    kept = kept_rank(record, last)
    if kept is not None:
        return kept
    key = keys.member(record.round, node_id)
    kv = await store.get(key)
    if kv is None:
        return None
    rank = MemberRecord.decode(key, kv.value).rank
    if rank >= record.world_size:
        raise RendezvousStateError(f"rendezvous state at {key!r}: rank {rank} out of range")
    return rank


@dataclass(frozen=True, slots=True)
class DriverRecord:
    """The node that drives the forming ``round`` (counts arrivals, runs last call, finalises)."""

    round: int
    node_id: str

    def encode(self) -> bytes:
        return (
            f'{{"v":{SCHEMA_VERSION},"kind":"driver","r":{self.round:d},"id":{_str(self.node_id)}}}'
        ).encode()

    @classmethod
    def decode(cls, key: str, value: bytes) -> DriverRecord:
        return _decode_driver(key, value)  # (the same event to every node: as RoundRecord's)


@functools.lru_cache(maxsize=64)
def _decode_driver(key: str, value: bytes) -> DriverRecord:
    obj = _load(key, value, "driver")
    return DriverRecord(_field_int(key, obj, "r", 0), _field_id(key, obj, "id"))


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

    One read of the round record, and of this node's member record when the round is full
    (O(1), not the run's every record, as :func:`~aioelastic.rendezvous.read_run_status` does);
    store errors propagate.
    """
    key = RunKeys(run_id).round
    kv = await store.get(key)
    latest = None if kv is None else RoundRecord.decode(key, kv.value)
    if latest is None or latest.world_size < max_nodes:
        return None
    if await read_rank(store, RunKeys(run_id), latest, node_id) is not None:
        return None
    return latest.round, latest.world_size
