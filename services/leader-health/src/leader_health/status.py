"""A peer daemon's `/status`, read through the policy's expressions (`peer_status`).

Daemons spell their status differently: the runbooks' daemon keys `peers` by node id and gives
each peer's `selfplay_jobs` and `gpu_percent`; another lists the ids it sees alive. The policy
names, per field, a JMESPath expression; `StatusReader.read` evaluates them and checks what they
found. A document that does not fit raises `StatusMismatch`, which names the field, its
expression and what it found instead (the probe makes it the peer's `bad_answer`).

The common expressions (a field, `a.b`, `not_null(...)` of those: every preset's) are read by plain
Python that gives what JMESPath gives: each peer's `/status` lists every peer, so a round over
1,000 peers reads a million peer entries, four expressions each, and JMESPath's interpreter spent
most of the round's 25 s on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jmespath
from pydantic import BaseModel, ConfigDict, Field

from gpumedic_incidents.policy import STATUS_PRESETS, StatusFields

MAX_ID = 253
MAX_PEERS = 4096
_LOADS_KEPT = 65536
"""Distinct peer entries remembered (`StatusReader._load_once`) before the memory starts again."""


class PeerLoad(BaseModel):
    """One peer as the answering daemon knows it (for the leader: the cluster's view of its jobs)."""

    model_config = ConfigDict(frozen=True)

    alive: bool = True
    voter: bool | None = None
    jobs: int | None = Field(default=None, ge=0)
    gpu_percent: float | None = Field(default=None, ge=0, le=100)


class PeerStatus(BaseModel):
    """What a peer says about itself and the cluster."""

    model_config = ConfigDict(frozen=True)

    node_id: str = Field(min_length=1, max_length=MAX_ID)
    leader: str | None = Field(default=None, max_length=MAX_ID, description="Null when the peer knows no leader.")
    peers: tuple[str, ...] = Field(default=(), max_length=MAX_PEERS, description="The peers it sees alive.")
    role: str | None = Field(default=None, max_length=32)
    voters: int | None = Field(default=None, ge=0, description="The voters it sees alive, itself included.")
    voters_total: int | None = Field(default=None, ge=0)
    quorum: bool | None = None
    uptime_s: float | None = Field(default=None, ge=0)
    loads: dict[str, PeerLoad] = Field(default_factory=dict, description="Per peer (a `peers` object): alive, voter, jobs, GPU %.")

    def voter_ids(self) -> set[str]:
        """The peers it says vote (from a `peers` object), itself not included unless listed."""
        return {node for node, load in self.loads.items() if load.voter}


class StatusMismatch(ValueError):
    """The document does not fit the expressions: which field, which expression, what was there."""


class _Plain:
    """A JMESPath expression of fields, `a.b` and `not_null(...)` read by plain Python, with
    JMESPath's results (a field of anything but an object is null)."""

    def __init__(self, read: Callable[[Any], Any]) -> None:
        self.search = read


def compile_expression(expression: str) -> _Plain | jmespath.parser.ParsedResult:
    """An expression as the reader evaluates it (`.search(document)`): plain Python where it can."""
    compiled = jmespath.compile(expression)
    read = _plain(compiled.parsed)
    return compiled if read is None else _Plain(read)


def _plain(node: dict) -> Callable[[Any], Any] | None:
    """A reader for the parsed expression `node`, or None when it is more than fields, `a.b` and `not_null`."""
    kind, children = node.get("type"), node.get("children", [])
    if kind == "field":
        name = node["value"]
        return lambda value: value.get(name) if isinstance(value, dict) else None
    parts = [_plain(child) for child in children]
    if None in parts or not parts:
        return None
    if kind == "subexpression" and len(parts) == 2:
        left, right = parts
        return lambda value: right(left(value))
    if kind == "function_expression" and node.get("value") == "not_null":
        return lambda value: next((found for part in parts if (found := part(value)) is not None), None)
    return None


class StatusReader:
    def __init__(self, fields: StatusFields = STATUS_PRESETS["runbook"]) -> None:
        self.fields = fields
        self._compiled = {name: compile_expression(expression) for name, expression in fields.model_dump().items()}
        self._loads: dict[tuple, PeerLoad] = {}

    def read(self, document: Any) -> PeerStatus:
        if not isinstance(document, dict):
            raise StatusMismatch(f"/status is a JSON {_json_type(document)}, not an object")
        node_id = self._text(document, "node_id", required=True)
        leader = self._text(document, "leader")
        role = self._text(document, "role", limit=32)
        alive, loads = self._peers(document)
        voters, total = self._voters(document, node_id, alive, loads)
        quorum = self._get(document, "quorum")
        if quorum is not None and not isinstance(quorum, bool):
            raise self._mismatch("quorum", quorum, "a boolean")
        uptime = self._number(document, "uptime_s")
        if leader is not None and loads and leader != node_id and leader not in loads:
            raise StatusMismatch(f"its leader {_show(leader)} is not one of its {len(loads)} peers nor itself")
        return PeerStatus(node_id=node_id, leader=leader, peers=alive, role=role, voters=voters, voters_total=total,
                          quorum=quorum, uptime_s=uptime, loads=loads)

    # --- fields ---------------------------------------------------------------------------------

    def _get(self, document: Any, name: str) -> Any:
        try:
            return self._compiled[name].search(document)
        except jmespath.exceptions.JMESPathError as exc:  # a function given the wrong type of value
            raise StatusMismatch(f"{name} ({getattr(self.fields, name)!r}) cannot be read: {str(exc).splitlines()[0]}") from None

    def _mismatch(self, name: str, found: Any, wanted: str) -> StatusMismatch:
        return StatusMismatch(f"{name} ({getattr(self.fields, name)!r}) found {_describe(found)}, not {wanted}")

    def _text(self, document: Any, name: str, *, required: bool = False, limit: int = MAX_ID) -> str | None:
        value = self._get(document, name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value or len(value) > limit:
            raise self._mismatch(name, value, f"a text of 1 to {limit} characters")
        return value

    def _number(self, document: Any, name: str) -> float | None:
        value = self._get(document, name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise self._mismatch(name, value, "a number of 0 or more")
        return float(value)

    def _peers(self, document: Any) -> tuple[tuple[str, ...], dict[str, PeerLoad]]:
        """(the peers it sees alive, each peer's load when `peers` is an object)."""
        value = self._get(document, "peers")
        if value is None:
            return (), {}
        if isinstance(value, list):
            if len(value) > MAX_PEERS:
                raise self._mismatch("peers", value, f"a list of at most {MAX_PEERS} node ids")
            for peer in value:
                if not (isinstance(peer, str) and 0 < len(peer) <= MAX_ID):
                    raise self._mismatch("peers", peer, f"a node id of 1 to {MAX_ID} characters")
            return tuple(value), {}
        if not isinstance(value, dict):
            raise self._mismatch("peers", value, "a list of node ids or an object keyed by node id")
        if len(value) > MAX_PEERS:
            raise self._mismatch("peers", value, f"at most {MAX_PEERS} peers")
        loads = {}
        for node, entry in value.items():
            if not 0 < len(node) <= MAX_ID:
                raise StatusMismatch(f"peers: a node id of {len(node)} characters (1 to {MAX_ID} are allowed)")
            loads[node] = self._load_once(node, entry)
        return tuple(node for node, load in loads.items() if load.alive), loads

    def _load_once(self, node: str, entry: Any) -> PeerLoad:
        """`_load`, remembered by the entry's content: every peer's `/status` lists the same entry for
        a peer (a round over 1,000 peers reads each of them 1,000 times). Keyed with each value's
        type, so a `true` is never taken for a `1`; an entry that does not fit is never remembered."""
        try:
            key = tuple((name, type(value), value) for name, value in entry.items()) if isinstance(entry, dict) else None
            known = self._loads.get(key) if key is not None else None
        except TypeError:  # a value that is a list or an object: read each time
            key = known = None
        if known is not None:
            return known
        load = self._load(node, entry)
        if key is not None:
            if len(self._loads) >= _LOADS_KEPT:
                self._loads.clear()
            self._loads[key] = load
        return load

    def _load(self, node: str, entry: Any) -> PeerLoad:
        if not isinstance(entry, dict):
            return PeerLoad()  # a bare value per id says no more than that the peer is listed
        alive, voter = self._get(entry, "peer_alive"), self._get(entry, "peer_voter")
        jobs, gpu = self._get(entry, "peer_jobs"), self._get(entry, "peer_gpu_percent")
        where = f"peers[{_show(node)}]"
        for name, value, ok, wanted in (
            ("peer_alive", alive, isinstance(alive, bool), "a boolean"),
            ("peer_voter", voter, isinstance(voter, bool), "a boolean"),
            ("peer_jobs", jobs, isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 0, "a count of 0 or more"),
            ("peer_gpu_percent", gpu, _percent(gpu), "a percentage (0 to 100)"),
        ):
            if value is not None and not ok:
                raise StatusMismatch(f"{where}: {self._mismatch(name, value, wanted)}")
        return PeerLoad(alive=alive is not False, voter=voter, jobs=jobs, gpu_percent=None if gpu is None else float(gpu))

    def _voters(self, document: Any, node_id: str, alive: tuple[str, ...], loads: dict[str, PeerLoad]) -> tuple[int | None, int | None]:
        """(voters alive, voters in all) as the daemon reports them: two numbers, a list of the
        live voters' ids, or (failing both) the voters flagged among its peers."""
        found, total = self._get(document, "voters_alive"), self._get(document, "voters_total")
        if isinstance(found, list):
            if not all(isinstance(v, str) for v in found):
                raise self._mismatch("voters_alive", found, "a count or a list of node ids")
            found = len(set(found))
        if found is not None and (isinstance(found, bool) or not isinstance(found, int) or found < 0):
            raise self._mismatch("voters_alive", found, "a count of 0 or more")
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 1):
            raise self._mismatch("voters_total", total, "a count of 1 or more")
        if found is None and total is None and any(load.voter is not None for load in loads.values()):
            flagged = {node for node, load in loads.items() if load.voter}
            return len({v for v in flagged if v == node_id or v in alive}), len(flagged)
        if found is not None and total is not None and found > total:
            raise StatusMismatch(f"it counts {found} voters alive of {total} in all (voters_alive above voters_total)")
        return found, total


DEFAULT_READER = StatusReader()


def _percent(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= 100


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}.get(
        type(value), type(value).__name__)


def _describe(value: Any) -> str:
    return "nothing" if value is None else f"a JSON {_json_type(value)} {_show(value)}"


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

