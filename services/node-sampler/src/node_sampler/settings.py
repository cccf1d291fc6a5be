"""The node-sampler's settings, read once from GPUMEDIC_SAMPLER_* (NATS from GPUMEDIC_NATS_*).

Only what a GPU node needs: where NATS is, what this node is called, how often to sample, and
which job probes to run. List values come as JSON, e.g.
GPUMEDIC_SAMPLER_WATCH_PATHS='["/data/selfplay", "/data/checkpoints"]'.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpumedic_bus import NatsSettings
from gpumedic_events.base import NodeId, default_node_id
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from node_sampler.containers import MAX_LOG_LINES
from node_sampler.jobs import RowGrowthProbe, compile_jobs_path
from node_sampler.logwatch import MAX_PATTERNS, LogPattern


class Settings(BaseSettings):
    """How one node-sampler runs."""

    # An entry may be refused for the password it holds (WATCH_ROWS): the error says why, never echoes it.
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_SAMPLER_", extra="ignore", hide_input_in_errors=True)

    nats: NatsSettings = Field(default_factory=NatsSettings, description="How to reach NATS (GPUMEDIC_NATS_*).")
    node_id: NodeId = Field(
        default_factory=default_node_id, description="This node's id in the fleet inventory; default: the hostname."
    )
    interval_s: float = Field(default=5.0, gt=0, le=3600, description="Seconds between samples.")
    proc_root: Path = Field(default=Path("/proc"), description="Where the process table is mounted.")
    ib_root: Path = Field(
        default=Path("/sys/class/infiniband"), description="Where the kernel lists the RDMA devices (InfiniBand, RoCE) and their ports."
    )
    status_url: str | None = Field(
        default=None, description="The node's own status endpoint (HTTP GET, JSON), probed for its job count."
    )
    status_jobs_path: str = Field(
        default="selfplay_jobs", description="JMESPath expression of the job count in the status answer (jmespath.org), "
        "e.g. selfplay_jobs or p2p.jobs[0].count.",
    )
    status_timeout_s: float = Field(default=2.0, gt=0, le=60, description="Deadline for the status probe.")
    listen_port: int | None = Field(
        default=None, ge=0, le=65535, description="The local port whose accept queue is watched (runbook 002: a blocked "
        "daemon's connections pile up unaccepted); unset: the status URL's port when it is a loopback URL; 0: none.",
    )
    job_process_pattern: str | None = Field(
        default=None, description="Regular expression: processes whose command line matches are jobs."
    )
    job_label_env: str = Field(
        default="",
        pattern=r"^([A-Za-z_][A-Za-z0-9_]{0,63})?$",
        description="An environment variable of your jobs' processes whose value names the job across nodes (e.g. JOB_ID); "
        "first before torchrun's, Slurm's and the rendezvous address. Only it and the launchers' variables are read.",
    )
    ras_port: int = Field(
        default=28028, ge=0, le=65535, description="NCCL's RAS client port on this node (NCCL_RAS_ADDR's; 0: never ask): asked, "
        "read-only, which ranks a job misses once a job's ranks here idle for ras_after_s.",
    )
    ras_host: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9.:_-]{1,253}$", description="Where RAS listens (NCCL_RAS_ADDR's host).")
    ras_after_s: float = Field(default=120.0, ge=0, le=86400, description="How long a job's ranks here idle before RAS is asked.")
    ras_every_s: float = Field(default=60.0, gt=0, le=86400, description="How often RAS is asked again while they stay idle.")
    ras_timeout_s: float = Field(default=15.0, gt=0, le=300, description="Deadline for one RAS answer (a hung job's takes seconds).")
    watch_paths: list[Path] = Field(
        default_factory=list, description="Files or directories whose growth means the jobs produce output."
    )
    watch_rows: list[str] = Field(
        default_factory=list,
        description="SQLite tables whose new rows mean the jobs produce output, as PATH:TABLE, e.g. /data/games/selfplay.db:games "
        "(runbook 000's game count: rows written into a database's free pages grow no file), or PostgreSQL ones as "
        "postgresql://USER@HOST[:PORT]/DATABASE:TABLE (its insert counter; the password in ~/.pgpass or PGPASSFILE, never here).",
    )
    expect_files: list[Path] = Field(
        default_factory=list, max_length=64,
        description="Files every node must have, by absolute path (runbook 002's canonical models): each sample says whether "
        "each is there and its SHA-256 (read again only when it changed); the detector compares them across the fleet.",
    )
    files_root: Path = Field(
        default=Path("/"), description="Where the node's file system is mounted for the sampler (/host in a container that "
        "mounts it there): the expected files are read under it, and named as the node names them.",
    )
    checks_dir: Path | None = Field(
        default=None, description="A directory of the operator's own check scripts (node-problem-detector's contract: exit 0 "
        "ok, 1 a problem, 2 unknown; the first line printed says why), each executable file a check; empty: none.",
    )
    checks_interval_s: float = Field(default=60.0, gt=0, le=86400, description="How often the checks run, one after another.")
    checks_timeout_s: float = Field(default=10.0, gt=0, le=600, description="How long one check may take; then its process group is killed.")
    log_patterns: list[LogPattern] = Field(
        default_factory=list, max_length=MAX_PATTERNS,
        description="Your log patterns, each counted over its sources: {\"name\": \"worker-errors\", \"regex\": "
        "\"Authentication failed|SSH connection failed\", \"sources\": [\"/var/log/worker.log\", \"journal:worker.service\"]} "
        "(a file, read under files_root; journal; journal:UNIT; container:NAME, through the Docker engine). The policy's "
        "kinds.log_pattern says how many matches make an incident.",
    )
    disk_paths: list[Path] | None = Field(
        default=None,
        description="Paths whose file system use goes into every sample, e.g. data directories. Unset: / and, where Docker "
        "keeps its data on a file system of its own, /var/lib/docker.",
    )
    holder_scan_interval_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Seconds between scans of every process's open files for /dev/nvidia* holders; 0 turns it off.",
    )
    health_interval_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds between reads of each GPU's slowly changing figures (maxima, thresholds, "
        "PCIe link, ECC totals, NVLinks); a GPU's go out in that sample when they changed.",
    )
    health_refresh_s: float = Field(
        default=600.0,
        gt=0,
        le=86400,
        description="Seconds after which a GPU's unchanged health figures go out again (for a consumer that started since).",
    )
    xid_events: bool = Field(default=True, description="Watch the NVML event set for XID errors.")
    kernel_log: Path | None = Field(
        default=Path("/dev/kmsg"), description="The kernel log to read OOM kills from (needs CAP_SYSLOG); empty: off."
    )
    docker_socket: Path | None = Field(
        default=Path("/var/run/docker.sock"),
        description="The Docker engine socket to watch container exits on; empty: off.",
    )
    container_log_lines: int = Field(
        default=MAX_LOG_LINES, ge=0, le=MAX_LOG_LINES,
        description="Last log lines a container's exit carries (a post-mortem reads 50, the runbooks' own figure); 0: none.",
    )
    trace_to_bus: bool = Field(default=False, description="Send finished spans over the bus (embedded mode).")

    @field_validator("kernel_log", "docker_socket", "checks_dir", mode="before")
    @classmethod
    def _empty_is_off(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("watch_rows")
    @classmethod
    def _tables(cls, value: list[str]) -> list[str]:
        RowGrowthProbe.parse(value)
        return value

    @field_validator("status_jobs_path")
    @classmethod
    def _an_expression(cls, value: str) -> str:
        compile_jobs_path(value)
        return value

    @field_validator("job_process_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value
