"""Scenario files: faults scripted into a simulated fleet, at set times, on set nodes and GPUs.

A scenario is a YAML mapping::

    name: mixed-faults                # optional; defaults to the file's name without .yaml
    description: optional text        # optional
    duration_s: 120                   # optional: how long `gpumedic sim` runs once the fleet is up
                                      # (the command line may override it); no fault may come later
    faults:                           # required (may be empty): one mapping per fault
      - at: 10                        # seconds after start: 10, 2.5, "10s", "2m", "1m30s", "1h"
        fault: zombie_job             # a kind of gpumedic_sim.faults.FAULTS (below)
        node: 3                       # 1-based index into the fleet, a node id ("sim-node-03"),
                                      # or "random"
        gpu: 2                        # for the kinds that take a GPU: 0 .. GPUs per node - 1,
                                      # or "random"
      - {at: 30s, fault: xid, node: random, gpu: 0, xid: 79}
      - {at: 40s, fault: disk_full, node: 7, path: /var/lib/docker}

The kinds a scenario may script, faults (`Fault`) and benign behaviours (`Benign`, which a
healthy fleet does all day and which must open no incident), and the fields each takes besides
`at`, `fault` and `node`, with their defaults, are the entries of `gpumedic_sim.faults.FAULTS`;
`gpumedic sim --kinds` prints them. The peer cluster's whole-cluster faults (`quorum_lost`,
`split_brain`, `leader_flapping`, `peers_never_join`) are scored on the cluster (`sim`), whatever
node they name.

`gpu` is required for the kinds that take one and refused for the others. "random" (for `node`
and `gpu`) is drawn from `random.Random(seed)` in file order, so a seed reproduces a run. The
loaded `Scenario` holds resolved faults (node ids and GPU indexes), sorted by time.

On the command line one fault is a comma-separated list of the same fields as `key=value`::

    --fault fault=zombie_job,at=10s,node=3,gpu=2
    --fault fault=xid,at=1m,node=random,gpu=0,xid=48
    --fault fault=disk_full,at=40,node=sim-node-07,path=/data

A scenario may also run a rented worker pool beside the fleet (`pool:`, see
`gpumedic_sim.fleet.plan.PoolPlan`): tasks arriving on a demand curve into a task database, workers
rented from a simulated provider over RunPod's API, and the runbook's worker faults::

    pool:
      demand: [{for: 40s, tasks_per_min: 60}, {for: 80s, tasks_per_min: 3}]
      task: 20s                       # how long a task runs on a GPU
      never_ssh_every: 5              # every 5th rented worker never comes up
      workers_die_at: [30s]           # the busiest worker dies silently, tasks In Progress
      scaling: {min_active_gpus: 2, max_active_gpus: 16, gpus_per_worker: 2, cooldown_s: 20}

A scenario may say what a run must reach (`expect:`, see `gpumedic_sim.runs.scoring.Expectations`);
`gpumedic sim` then exits 1 when the run falls short, or when a pool check fails::

    expect: {recall: 1.0, precision: 1.0, false_positives: 0}

Every problem raises `ScenarioError`, whose message names the file (or the option) and the place
in it, e.g. ``faults.yaml: faults[3].gpu: 9 is beyond the fleet's 8 GPUs per node (0-7)``.
`builtin_scenarios()` lists the scenarios shipped in this package's `scenarios/` folder, which
`resolve_scenario_path` finds by name as well as by path.
"""

from __future__ import annotations

import difflib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpumedic_sim.faults import FAULTS, PARAMETERS, Scripted
from gpumedic.times import parse_time
from gpumedic.times import fmt_time as _fmt_time
from gpumedic.times import show as _show
from gpumedic_sim.fleet.plan import PoolPlan
from gpumedic_sim.runs.scoring import Expectations
from gpumedic_incidents import Policy

SCENARIO_DIR = Path(__file__).parent / "scenarios"
"""Where the scenarios shipped with the package live."""
MAX_FAULTS = 10_000
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_NAME = 200
RANDOM = "random"
M = TypeVar("M", bound=BaseModel)

CLI_SYNTAX = "fault=KIND,at=TIME,node=NODE[,gpu=GPU][,xid=N][,path=PATH][,for=TIME][,every=TIME][,count=N][,image=IMAGE]"
CLI_EXAMPLE = "fault=zombie_job,at=10s,node=3,gpu=2"


SCRIPTED: tuple[Scripted, ...] = tuple(FAULTS)

_COMMON_FIELDS = ("fault", "at", "node", "gpu")
_ALL_PARAMS = tuple(sorted({name for entry in FAULTS.values() for name in entry.params}))
_TOP_FIELDS = ("name", "description", "duration_s", "faults", "pool", "expect", "policy")


class ScenarioError(ValueError):
    """A scenario (file or command-line fault) that cannot run; the message says where and why."""

    def __init__(self, source: str, where: str, problem: str) -> None:
        super().__init__(f"{source}: {where}: {problem}" if where else f"{source}: {problem}")
        self.source = source
        self.where = where
        self.problem = problem


@dataclass(frozen=True)
class FaultSpec:
    """One fault to inject, resolved against the fleet: a node id and a GPU index (or None)."""

    at_s: float
    fault: Scripted
    node: str
    gpu: int | None
    params: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    def __str__(self) -> str:
        where = self.node if self.gpu is None else f"{self.node} GPU {self.gpu}"
        extra = "".join(f" {k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.fault.value} at {_fmt_time(self.at_s)} on {where}{extra}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float | None
    faults: tuple[FaultSpec, ...]
    """Sorted by `at_s`; faults at the same time keep their order in the file."""
    pool: PoolPlan | None = None
    """A rented worker pool fed by a task queue, beside the fleet."""
    expect: Expectations | None = None
    """What a run must reach (with a pool, every pool check too); None: the run only reports."""
    policy: Mapping[str, Any] = field(default_factory=dict)
    """The operator's changes to the run's policy (a part of a policy file, over the sim's), checked when read."""

    @property
    def last_fault_s(self) -> float | None:
        return self.faults[-1].at_s if self.faults else None

    def with_faults(self, extra: Sequence[FaultSpec]) -> Scenario:
        """This scenario plus `extra` (e.g. from `--fault`), sorted by time again."""
        return replace(self, faults=tuple(sorted((*self.faults, *extra), key=lambda f: f.at_s)))


# --- finding scenarios --------------------------------------------------------------------------


def builtin_scenarios() -> dict[str, Path]:
    """The scenarios shipped with the package, by name (file name without .yaml/.yml)."""
    if not SCENARIO_DIR.is_dir():
        return {}
    found: dict[str, Path] = {}
    for path in sorted(SCENARIO_DIR.iterdir()):
        if path.suffix in (".yaml", ".yml") and path.is_file():
            found.setdefault(path.stem, path)
    return found


def resolve_scenario_path(name_or_path: str | Path) -> Path:
    """A scenario file: `name_or_path` if that file exists, else the built-in scenario of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    text = str(name_or_path)
    builtins = builtin_scenarios()
    if text in builtins:
        return builtins[text]
    known = ", ".join(builtins) or "none"
    if path.is_dir():
        raise ScenarioError(text, "", "is a directory, not a scenario file")
    raise ScenarioError(text, "", f"no such file, nor a built-in scenario of that name (built-in: {known})")


# --- loading ------------------------------------------------------------------------------------


def load_scenario(path: str | Path, *, node_ids: Sequence[str], gpus_per_node: int, seed: int = 0) -> Scenario:
    """Read, check and resolve a scenario file against a fleet of `node_ids` with `gpus_per_node`."""
    path = Path(path)
    source = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(source, "", f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ScenarioError(source, "", f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, "", f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(source, _yaml_where(exc), f"not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        raise ScenarioError(source, "", "is empty; expected a mapping with at least `faults`")
    default_name = path.name.removesuffix(".yaml").removesuffix(".yml")
    return parse_scenario(
        data, source=source, node_ids=node_ids, gpus_per_node=gpus_per_node, seed=seed, default_name=default_name
    )


def parse_scenario(
    data: object,
    *,
    source: str,
    node_ids: Sequence[str],
    gpus_per_node: int,
    seed: int = 0,
    default_name: str | None = None,
) -> Scenario:
    """Check and resolve an already parsed scenario (`source` names it in error messages)."""
    fleet = _Fleet(tuple(node_ids), gpus_per_node)
    if not isinstance(data, Mapping):
        raise ScenarioError(source, "", f"expected a mapping with at least `faults`, got {_type_name(data)}")
    for key in data:
        if key not in _TOP_FIELDS:
            raise ScenarioError(
                source,
                "",
                f"unknown field {_show(key)}{_suggest(key, _TOP_FIELDS)}; a scenario has: {', '.join(_TOP_FIELDS)}",
            )

    name = data.get("name", default_name if default_name is not None else _stem(source))
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(source, "name", f"expected a non-empty text, got {_show(name)}")
    if len(name) > MAX_NAME:
        raise ScenarioError(source, "name", f"longer than {MAX_NAME} characters")
    description = data.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise ScenarioError(source, "description", f"expected text, got {_type_name(description)}")

    duration_s: float | None = None
    if data.get("duration_s") is not None:
        try:
            duration_s = parse_time(data["duration_s"])
        except ValueError as exc:
            raise ScenarioError(source, "duration_s", str(exc)) from None
        if duration_s <= 0:
            raise ScenarioError(source, "duration_s", "must be more than 0")

    if "faults" not in data:
        raise ScenarioError(source, "", "missing field 'faults' (a list; may be empty)")
    entries = data["faults"]
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise ScenarioError(source, "faults", f"expected a list of faults, got {_type_name(entries)}")
    if len(entries) > MAX_FAULTS:
        raise ScenarioError(source, "faults", f"{len(entries)} faults; at most {MAX_FAULTS} are allowed")

    rng = random.Random(seed)
    faults = [
        _parse_fault(entry, source=source, where=f"faults[{i}]", fleet=fleet, rng=rng, duration_s=duration_s)
        for i, entry in enumerate(entries)
    ]
    faults.sort(key=lambda f: f.at_s)
    pool = _section(PoolPlan, data, "pool", source)
    expect = _section(Expectations, data, "expect", source)
    policy = _policy(data.get("policy"), source)
    return Scenario(name=name.strip(), description=description.strip(), duration_s=duration_s, faults=tuple(faults), pool=pool,
                    expect=expect, policy=policy)


def _policy(value: object, source: str) -> Mapping[str, Any]:
    """The scenario's `policy:` (a part of a policy file), checked over the shipped policy now, not when the run starts."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError(source, "policy", f"expected a mapping (a part of a policy file), got {_type_name(value)}")
    try:
        Policy.model_validate(merged(Policy().model_dump(mode="json"), dict(value)))
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise ScenarioError(source, ".".join(str(p) for p in ("policy", *first["loc"])), first["msg"].removeprefix("Value error, ")) from None
    return MappingProxyType(dict(value))


def merged(base: dict, extra: Mapping) -> dict:
    """`extra` over `base`, mapping by mapping (a kind's threshold keeps the kind's ladder)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(base[key], value) if isinstance(value, Mapping) and isinstance(base.get(key), dict) else value
    return out


def _section(model: type[M], data: Mapping, name: str, source: str) -> M | None:
    """The scenario's section `name` as `model`, None when absent; ScenarioError names the first problem's place."""
    if data.get(name) is None:
        return None
    try:
        return model.model_validate(data[name])
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in (name, *first["loc"]))
        raise ScenarioError(source, where, first["msg"].removeprefix("Value error, ")) from None


def parse_fault_option(
    text: str,
    *,
    node_ids: Sequence[str],
    gpus_per_node: int,
    seed: int = 0,
    rng: random.Random | None = None,
    duration_s: float | None = None,
) -> FaultSpec:
    """One `--fault` value: comma-separated `key=value` fields, as in a scenario file's fault
    entry (`CLI_SYNTAX`). Pass one `rng` to several calls so their "random" draws differ."""
    source = f"--fault {text!r}"
    syntax = f"expected {CLI_SYNTAX}, e.g. {CLI_EXAMPLE}"
    if not text.strip():
        raise ScenarioError(source, "", f"empty; {syntax}")
    entry: dict[str, object] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ScenarioError(source, "", f"{part.strip()!r} is not key=value; {syntax}")
        if key in entry:
            raise ScenarioError(source, key, f"given twice; {syntax}")
        entry[key] = int(value) if key in ("gpu", "xid", "count") and re.fullmatch(r"[+-]?\d+", value) else value
    fleet = _Fleet(tuple(node_ids), gpus_per_node)
    return _parse_fault(
        entry,
        source=source,
        where="",
        fleet=fleet,
        rng=rng if rng is not None else random.Random(seed),
        duration_s=duration_s,
        syntax_hint=f"; {syntax}",
    )


# --- times --------------------------------------------------------------------------------------

# --- one fault ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fleet:
    node_ids: tuple[str, ...]
    gpus_per_node: int

    def __post_init__(self) -> None:
        if not self.node_ids:
            raise ValueError("a fleet has at least one node")
        if self.gpus_per_node < 0:
            raise ValueError("gpus_per_node must be 0 or more")


def _parse_fault(
    entry: object,
    *,
    source: str,
    where: str,
    fleet: _Fleet,
    rng: random.Random,
    duration_s: float | None,
    syntax_hint: str = "",
) -> FaultSpec:
    def at(name: str) -> str:
        return f"{where}.{name}" if where else name

    if not isinstance(entry, Mapping):
        raise ScenarioError(source, where, f"expected a mapping with fault, at, node, got {_type_name(entry)}")
    for key in entry:
        if not isinstance(key, str):
            raise ScenarioError(source, where, f"field names are text, got {_show(key)}")

    if "fault" not in entry:
        raise ScenarioError(source, where, f"missing field 'fault'{syntax_hint}")
    kind_value = entry["fault"]
    kind = next((k for k in SCRIPTED if isinstance(kind_value, str) and k.value == kind_value), None)
    if kind is None:
        known = ", ".join(k.value for k in SCRIPTED)
        hint = _suggest(kind_value, [k.value for k in SCRIPTED]) if isinstance(kind_value, str) else ""
        raise ScenarioError(
            source, at("fault"), f"{_show(kind_value)} is not a fault kind nor a benign behaviour{hint}; known: {known}"
        ) from None

    params = FAULTS[kind].params
    allowed = ["fault", "at", "node", *(["gpu"] if FAULTS[kind].gpu else []), *params]
    for key in entry:
        if key in allowed:
            continue
        if key == "gpu":
            raise ScenarioError(source, at("gpu"), f"{kind.value} is a fault of the whole node and takes no GPU")
        if key in _ALL_PARAMS:
            owners = ", ".join(k.value for k, e in FAULTS.items() if key in e.params)
            raise ScenarioError(source, where, f"field {key!r} applies to {owners}, not to {kind.value}")
        raise ScenarioError(
            source,
            where,
            f"unknown field {_show(key)}{_suggest(key, [*_COMMON_FIELDS, *_ALL_PARAMS])}; "
            f"{kind.value} takes: {', '.join(allowed)}",
        )
    required = ("at", "node", *(["gpu"] if FAULTS[kind].gpu else []))
    for name in required:
        if name not in entry:
            needs = ", ".join(required)
            raise ScenarioError(source, where, f"missing field {name!r} ({kind.value} needs {needs}){syntax_hint}")

    try:
        at_s = parse_time(entry["at"])
    except ValueError as exc:
        raise ScenarioError(source, at("at"), str(exc)) from None
    if duration_s is not None and at_s > duration_s:
        raise ScenarioError(
            source, at("at"), f"{_fmt_time(at_s)} is after the scenario's duration_s ({_fmt_time(duration_s)})"
        )

    node = _resolve_node(entry["node"], fleet, rng, source, at("node"))
    gpu = _resolve_gpu(entry["gpu"], fleet, rng, source, at("gpu")) if FAULTS[kind].gpu else None

    resolved: dict[str, object] = {}
    for name, default in params.items():
        value = entry.get(name, default)
        resolved[name] = _check_param(name, value, source, at(name))
    return FaultSpec(at_s=at_s, fault=kind, node=node, gpu=gpu, params=MappingProxyType(resolved))


def _resolve_node(value: object, fleet: _Fleet, rng: random.Random, source: str, where: str) -> str:
    n = len(fleet.node_ids)
    if isinstance(value, str):
        text = value.strip()
        if text == RANDOM:
            return rng.choice(fleet.node_ids)
        if text in fleet.node_ids:
            return text
        if re.fullmatch(r"\d+", text):
            value = int(text)
        else:
            hint = _same_number(text, fleet.node_ids)
            span = f"{fleet.node_ids[0]} .. {fleet.node_ids[-1]}" if n > 1 else fleet.node_ids[0]
            raise ScenarioError(
                source, where, f"{text!r} is not in the fleet ({n} node{'s' if n != 1 else ''}: {span}){hint}"
            )
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ScenarioError(source, where, f"{value} is not a node index; indexes start at 1 (1-{n})")
        if value > n:
            raise ScenarioError(source, where, f"{value} is beyond the fleet's {n} node{'s' if n != 1 else ''} (1-{n})")
        return fleet.node_ids[value - 1]
    raise ScenarioError(source, where, f"expected a node id, a 1-based index or 'random', got {_show(value)}")


def _resolve_gpu(value: object, fleet: _Fleet, rng: random.Random, source: str, where: str) -> int:
    k = fleet.gpus_per_node
    if k == 0:
        raise ScenarioError(source, where, "the fleet's nodes have no GPUs")
    if isinstance(value, str) and value.strip() == RANDOM:
        return rng.randrange(k)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(source, where, f"expected a GPU index (0-{k - 1}) or 'random', got {_show(value)}")
    if value < 0:
        raise ScenarioError(source, where, f"{value} is not a GPU index (0-{k - 1})")
    if value >= k:
        raise ScenarioError(source, where, f"{value} is beyond the fleet's {k} GPUs per node (0-{k - 1})")
    return value


def _check_param(name: str, value: object, source: str, where: str) -> object:
    try:
        return PARAMETERS[name](value)
    except ValueError as exc:
        raise ScenarioError(source, where, str(exc)) from None


# --- messages -----------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, str):
        return f"text {_show(value)}"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    return type(value).__name__


def _suggest(word: object, options: Sequence[str]) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _same_number(text: str, node_ids: Sequence[str]) -> str:
    """A hint when `text` names a node by the right number with other zero-padding."""
    m = re.fullmatch(r"(.*?)(\d+)", text)
    if m is None:
        return ""
    for node_id in node_ids:
        other = re.fullmatch(r"(.*?)(\d+)", node_id)
        if other is not None and other[1] == m[1] and int(other[2]) == int(m[2]):
            return f"; did you mean {node_id!r}?"
    return ""


def _stem(source: str) -> str:
    name = Path(source).name
    return name.removesuffix(".yaml").removesuffix(".yml") or "scenario"


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return ""
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if problem:
        return f"{context}, {problem}" if context else str(problem)
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
