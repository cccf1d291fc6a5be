"""The policy's `actions`: per catalogue operation, observe or enforce, and the allow-lists and limits
that make it safe."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gpumedic_events import ENDPOINT_PATTERN, UNIT_PATTERN
from gpumedic_incidents.policy.base import CHECK_COMMAND, HEALTH_URL, HOOK_URL, Mode, NodeSelector, SAMPLER_UNIT, Strict, selects

class ActionPolicy(Strict):
    mode: Mode = Field(
        default="enforce",
        description="observe: the remediator decides and records, never runs it. The remediator's own "
        "GPUMEDIC_REMEDIATOR_MODE=observe overrides every action.",
    )


class KillPolicy(ActionPolicy):
    grace_s: float = Field(default=10.0, ge=0, le=300, description="SIGTERM, this long to exit, then SIGKILL.")


class NodeScoped(Strict):
    """An allow-list entry that may be limited to some nodes."""

    nodes: tuple[str, ...] = Field(
        default=(),
        description="Where it may be used: node selectors (NODE, group:NAME, label:KEY=VALUE); empty: every node.",
    )

    @field_validator("nodes")
    @classmethod
    def _selectors(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            NodeSelector(text)
        return value

    def allowed_on(self, node_id: str, group: str | None, labels: Mapping[str, str] | None) -> bool:
        return not self.nodes or selects(tuple(map(NodeSelector, self.nodes)), node_id, group, labels)


def loopback_url(value: str, name: str) -> str:
    if not HEALTH_URL.fullmatch(value):
        raise ValueError(f"{name} {value[:100]!r} must be http://127.0.0.1|localhost|[::1][:port][/plain/path]")
    return value


class UnitRule(NodeScoped):
    health_url: str | None = Field(
        default=None, description="Checked with curl on the node after the restart, e.g. http://127.0.0.1:9400/healthz."
    )

    @field_validator("health_url")
    @classmethod
    def _loopback(cls, value: str | None) -> str | None:
        return value if value is None else loopback_url(value, "health_url")


class RestartPolicy(ActionPolicy):
    units: dict[str, UnitRule] = Field(
        default_factory=lambda: {SAMPLER_UNIT: UnitRule()},
        description="The allow-list: only these units are ever restarted.",
    )

    @field_validator("units")
    @classmethod
    def _unit_names(cls, value: dict[str, UnitRule]) -> dict[str, UnitRule]:
        for unit in value:
            if not re.fullmatch(UNIT_PATTERN, unit):
                raise ValueError(f"{unit[:100]!r} is not a systemd service name (letters, digits, :_.@-, ending .service)")
        return value


BODY_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
BODY_FIELDS = frozenset({"node_id"})
"""What an admin endpoint's body may be filled with, from the incident."""
BODY_TEXT = re.compile(r"^[A-Za-z0-9 _.:/@-]{0,128}$")


class AdminEndpoint(NodeScoped):
    url: str = Field(description="POSTed with curl on the node it is called on, e.g. http://127.0.0.1:8770/force_election.")
    target: Literal["node", "leader"] = Field(
        default="node",
        description="Where it is called: on the incident's node, or on the peer cluster's leader as the detector knows "
        "it (the runbook resets a node's job count on the leader).",
    )
    body: dict[str, str] = Field(
        default_factory=dict,
        description="The JSON object POSTed, each value a text that may name {node_id} (the incident's node), e.g. "
        '{node_id: "{node_id}"}; no other placeholders, plain characters only.',
    )

    @field_validator("url")
    @classmethod
    def _loopback(cls, value: str) -> str:
        return loopback_url(value, "url")

    @field_validator("body")
    @classmethod
    def _template(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 8:
            raise ValueError("a body of at most 8 fields")
        for key, text in value.items():
            if not BODY_KEY.fullmatch(key):
                raise ValueError(f"{key[:100]!r} is not a body field name (letters, digits, _)")
            try:
                parts = list(string.Formatter().parse(text))
            except ValueError as exc:
                raise ValueError(f"body.{key}: {text[:100]!r} is not a template ({exc})") from None
            for literal, field, spec, conversion in parts:
                if not BODY_TEXT.fullmatch(literal):
                    raise ValueError(f"body.{key}: {literal[:100]!r} has characters other than letters, digits and ' _.:/@-'")
                if field is not None and (field not in BODY_FIELDS or spec or conversion):
                    raise ValueError(f"body.{key}: {{{field}}} is not a placeholder it may use ({', '.join(sorted(BODY_FIELDS))})")
        return value

    def fill(self, node_id: str) -> dict[str, str]:
        """The body for an incident on `node_id`."""
        return {key: text.format(node_id=node_id) for key, text in self.body.items()}


class AdminPolicy(ActionPolicy):
    endpoints: dict[str, AdminEndpoint] = Field(
        default_factory=dict, description="The closed list: only these endpoints are ever called, by name."
    )

    @field_validator("endpoints")
    @classmethod
    def _names(cls, value: dict[str, AdminEndpoint]) -> dict[str, AdminEndpoint]:
        for name in value:
            if not re.fullmatch(ENDPOINT_PATTERN, name):
                raise ValueError(f"{name[:100]!r} is not an endpoint name (lower-case letters, digits and _)")
        return value


class JobRestart(NodeScoped):
    """One job the remediator may start again after a verified kill: exactly one of a systemd unit
    (restarted, then `systemctl is-active`) or an executable (an absolute path, run without arguments)."""

    unit: str | None = Field(default=None, pattern=UNIT_PATTERN, description="e.g. selfplay.service")
    command: str | None = Field(default=None, description="e.g. /opt/selfplay/bin/restart (exit 0: started)")

    @field_validator("command")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        if value is not None and (not CHECK_COMMAND.fullmatch(value) or "/../" in f"{value}/"):
            raise ValueError(f"command {value[:100]!r} must be an absolute path to an executable, no arguments, no '..'")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> JobRestart:
        if (self.unit is None) == (self.command is None):
            raise ValueError("give exactly one of unit and command")
        return self


class RestartJobPolicy(ActionPolicy):
    jobs: dict[str, JobRestart] = Field(default_factory=dict, description="The allow-list, by name: only these are ever started.")

    @field_validator("jobs")
    @classmethod
    def _names(cls, value: dict[str, JobRestart]) -> dict[str, JobRestart]:
        for name in value:
            if not re.fullmatch(ENDPOINT_PATTERN, name):
                raise ValueError(f"{name[:100]!r} is not a job name (lower-case letters, digits and _)")
        return value


PROCESS_PATTERN = re.compile(r"[A-Za-z0-9 ._/:=*+?()|^$\[\]-]{3,200}")
"""A command-line pattern as pgrep -f reads it (POSIX extended) and Python alike: letters, digits,
spaces and the plain operators; no quote, backslash or back-reference, so it means the same to both."""


class ProcessPattern(NodeScoped):
    regex: str = Field(description="Matched anywhere in a process's command line, as `pgrep -f` does, e.g. python.*selfplay.")
    max_processes: int = Field(default=64, ge=1, le=1024, description="More matches than this is refused: a pattern too wide.")

    @field_validator("regex")
    @classmethod
    def _plain(cls, value: str) -> str:
        if not PROCESS_PATTERN.fullmatch(value):
            raise ValueError(f"{value[:100]!r}: 3-200 letters, digits, spaces and . _ / : = * + ? ( ) | ^ $ [ ] -, nothing else")
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value[:100]!r} is not a regular expression: {exc}") from None
        if compiled.search(""):
            raise ValueError(f"{value[:100]!r} matches an empty command line, so every process")
        return value


class PatternKillPolicy(KillPolicy):
    patterns: dict[str, ProcessPattern] = Field(
        default_factory=dict, description="The allow-list, by name: a request names one of these, never a regular expression.",
    )

    @field_validator("patterns")
    @classmethod
    def _names(cls, value: dict[str, ProcessPattern]) -> dict[str, ProcessPattern]:
        for name in value:
            if not re.fullmatch(ENDPOINT_PATTERN, name):
                raise ValueError(f"{name[:100]!r} is not a pattern name (lower-case letters, digits and _)")
        return value


LOG_PATH = re.compile(r"(/[A-Za-z0-9_.@-]+)+")
"""A log's absolute path: plain characters, no `..` (checked apart), no glob, no option."""


class LogFile(NodeScoped):
    path: str = Field(description="The log's absolute path on the node, e.g. /workspace/logs/worker.log.")

    @field_validator("path")
    @classmethod
    def _plain(cls, value: str) -> str:
        if not LOG_PATH.fullmatch(value) or "/../" in f"{value}/" or "/./" in f"{value}/" or len(value) > 512:
            raise ValueError(f"{value[:100]!r}: an absolute path of letters, digits and _ . @ -, without . or ..")
        return value


class LogsPolicy(Strict):
    """What `gpumedic logs` may read on a node for a person (runbook 001's fetch_worker_logs): the
    allow-list, by name; a request names one, never a path."""

    files: dict[str, LogFile] = Field(default_factory=dict)

    @field_validator("files")
    @classmethod
    def _names(cls, value: dict[str, LogFile]) -> dict[str, LogFile]:
        for name in value:
            if not re.fullmatch(ENDPOINT_PATTERN, name):
                raise ValueError(f"{name[:100]!r} is not a log name (lower-case letters, digits and _)")
        return value


class PrunePolicy(ActionPolicy):
    volumes: bool = Field(default=False, description="Whether a prune may remove unused volumes (data!).")


class DrainPolicy(ActionPolicy):
    hook_url: str | None = Field(
        default=None,
        description="Your scheduler's drain hook: the remediator POSTs {node_id, drained, reason, incident_id, "
        "action_id} here on every drain and undrain, with the bearer token of GPUMEDIC_REMEDIATOR_HOOK_TOKEN_FILE.",
    )

    @field_validator("hook_url")
    @classmethod
    def _plain_url(cls, value: str | None) -> str | None:
        if value is not None and not HOOK_URL.fullmatch(value):
            raise ValueError(f"hook_url {value[:100]!r} must be a plain http(s)://host[:port][/path] (no user, query or fragment)")
        return value


class UndrainPolicy(ActionPolicy):
    check_command: str | None = Field(
        default=None,
        description="An executable on the node that exits 0 when it may take jobs again (e.g. a short GPU burn), "
        "run before the undrain; absolute path, no arguments.",
    )
    dcgm_diag: Literal[0, 1, 2] = Field(
        default=1,
        description="DCGM's diagnostics (`dcgmi diag -r N`) before the undrain, where the node has DCGM: 1 (about a "
        "minute), 2 (a few, with short PCIe and memory tests), 0: never. A failed test keeps the node drained.",
    )
    dcgm_diag_timeout_s: float = Field(default=900.0, gt=0, le=3600, description="How long the diagnostics may run.")

    @field_validator("check_command")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        if value is not None and (not CHECK_COMMAND.fullmatch(value) or "/../" in f"{value}/" or "/./" in f"{value}/"):
            raise ValueError(f"check_command {value[:100]!r} must be an absolute path of plain names, without arguments")
        return value


class SpawnPolicy(ActionPolicy):
    gpu_types: tuple[str, ...] = Field(
        default=(), description="The provider's GPU types a worker may be rented with; empty: no worker is ever rented."
    )
    max_gpus: int = Field(default=8, ge=1, le=8, description="GPUs per rented worker, at most.")
    max_count: int = Field(default=4, ge=1, le=16, description="Workers rented by one action, at most.")


SQL_PARAM = re.compile(r":([A-Za-z_][A-Za-z0-9_]*)")


def bound_once(sql: str | None, parameter: str) -> None:
    """The operator's SQL takes exactly one parameter, bound by the driver, never formatted in."""
    if sql is not None and set(SQL_PARAM.findall(sql)) != {parameter}:
        raise ValueError(f"the statement must use exactly one bound parameter, :{parameter}")


class TerminatePolicy(ActionPolicy):
    max_count: int = Field(default=4, ge=1, le=16, description="Workers ended by one action, at most.")
    tasks_query: str | None = Field(
        default=None, max_length=2000,
        description="SQL on the task database (GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE) that returns the ids of the tasks a worker "
        "runs now, with one bound parameter :worker_id, e.g. SELECT id FROM tasks WHERE worker_id = :worker_id AND status = "
        "'In Progress'. Set: when a worker the pool chose as idle took a task since, none is ended (the surplus asks again), "
        "and what an ended worker still ran is requeued (actions.requeue_tasks.statement) once it is gone. Null: neither.",
    )
    failed_tasks_query: str | None = Field(
        default=None, max_length=2000,
        description="SQL that returns the ids of the tasks that failed on a worker, with one bound parameter :worker_id, e.g. "
        "SELECT id FROM tasks WHERE worker_id = :worker_id AND status = 'Failed'. Set, with actions.requeue_tasks.failed_statement: "
        "a black hole's failed tasks go back to the queue once it is ended (they failed for the host, not for themselves).",
    )

    @model_validator(mode="after")
    def _one_bound_parameter(self) -> TerminatePolicy:
        bound_once(self.tasks_query, "worker_id")
        bound_once(self.failed_tasks_query, "worker_id")
        return self


class RestartWorkerPolicy(ActionPolicy):
    back_within_s: float = Field(
        default=600.0, gt=0, le=3600,
        description="How long the restarted pod has to be running again (the provider's start time past the request's).",
    )
    poll_s: float = Field(default=10.0, gt=0, le=300, description="How often the provider is asked meanwhile.")


class TaskDbPolicy(ActionPolicy):
    """A write to the user's task database (GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE): one statement,
    written here by the operator, whose only parameter is bound by the driver, never formatted in."""

    statement: str | None = Field(default=None, max_length=2000, description="The SQL statement; null: never run.")
    parameter: ClassVar[str] = ""

    @model_validator(mode="after")
    def _one_bound_parameter(self) -> TaskDbPolicy:
        bound_once(self.statement, self.parameter)
        return self


class RequeuePolicy(TaskDbPolicy):
    parameter: ClassVar[str] = "task_ids"
    failed_statement: str | None = Field(
        default=None, max_length=2000,
        description="SQL that puts failed tasks back in the queue, with one bound parameter :task_ids, guarded so that a task "
        "goes back once, e.g. UPDATE tasks SET status = 'Queued', worker_id = NULL, retried = 1 WHERE id IN :task_ids AND "
        "status = 'Failed' AND retried = 0. Run for a black hole's failed tasks (terminate_worker.failed_tasks_query); null: never.",
    )

    @model_validator(mode="after")
    def _failed_bound_once(self) -> RequeuePolicy:
        bound_once(self.failed_statement, self.parameter)
        return self


class MarkEndedPolicy(TaskDbPolicy):
    parameter: ClassVar[str] = "worker_id"


class AcceptPolicy(MarkEndedPolicy):
    """A new worker's on-node checks, then its promotion (`statement`, e.g. the runbook's
    `UPDATE workers SET status = 'active' WHERE id = :worker_id`; null: nothing is promoted)."""

    dcgm_diag: Literal[0, 1, 2] = Field(default=1, description="DCGM's diagnostics level where the node has DCGM; 0: never.")
    dcgm_diag_timeout_s: float = Field(default=900.0, gt=0, le=3600, description="How long the diagnostics may run.")


class Actions(Strict):
    """Per catalogue operation: observe or enforce, and its own limits."""

    kill_gpu_processes: KillPolicy = KillPolicy()
    restart_unit: RestartPolicy = RestartPolicy()
    gpu_reset: ActionPolicy = ActionPolicy()
    docker_prune: PrunePolicy = PrunePolicy()
    reboot_node: ActionPolicy = ActionPolicy(mode="observe")
    http_admin: AdminPolicy = AdminPolicy()
    restart_job: RestartJobPolicy = RestartJobPolicy()
    drain_node: DrainPolicy = DrainPolicy()
    undrain_node: UndrainPolicy = UndrainPolicy()
    spawn_worker: SpawnPolicy = SpawnPolicy()
    terminate_worker: TerminatePolicy = TerminatePolicy()
    restart_worker: RestartWorkerPolicy = RestartWorkerPolicy()
    requeue_tasks: RequeuePolicy = RequeuePolicy()
    mark_worker_ended: MarkEndedPolicy = MarkEndedPolicy()
    accept_worker: AcceptPolicy = AcceptPolicy()
    stop_job: KillPolicy = KillPolicy()
    """A hung job's ranks on every node of the job (job_hung's ladder, when it names it)."""
    kill_pattern: PatternKillPolicy = PatternKillPolicy()
    """Every process matching an allow-listed pattern (zombie_job's ladder, when it names one)."""

    def of(self, operation: str) -> ActionPolicy:
        return getattr(self, operation)
