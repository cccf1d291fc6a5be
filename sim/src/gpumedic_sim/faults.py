"""Every fault and benign behaviour the simulated fleet can script, in one table: the answer key.

`FAULTS` holds one entry per name a scenario may use: what it does (its description), the
incident kinds that rightly describe it (empty for benign behaviour, which must open none),
whether it happens to one GPU, its extra parameters with their defaults, and its stand-in: the
method of the simulated node (or, for the peer cluster, of the fleet) that makes it happen.
Injecting one is a lookup here and a call to that method. Adding one is an entry here and its
stand-in; the scenario parser, the fleet and the scorer read everything else from the entry.

The kinds are written from what the simulation does, never from a detector's rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Literal, NamedTuple

from gpumedic.times import parse_time, show
from gpumedic_events import IncidentKind as K


class Fault(StrEnum):
    """The faults the simulation can script: the names scenario files use and `injected` records."""

    ZOMBIE_JOB = "zombie_job"
    ORPHAN_GPU_HOLDER = "orphan_gpu_holder"
    GPU_STUCK = "gpu_stuck"
    OOM_KILL = "oom_kill"
    SEGFAULT = "segfault"
    SIGTERM = "sigterm"
    DISK_FULL = "disk_full"
    GPU_OOM = "gpu_oom"
    XID = "xid"
    GPU_LOST = "gpu_lost"
    SSH_REFUSES = "ssh_refuses"
    SSH_HANGS = "ssh_hangs"
    SAMPLER_SILENT = "sampler_silent"
    NVML_MISSING = "nvml_missing"
    STATUS_BLOCKED = "status_blocked"
    STATUS_BACKLOG = "status_backlog"
    STATUS_SLOW = "status_slow"
    PHANTOM_JOBS = "phantom_jobs"
    STUCK_PROCESS = "stuck_process"
    GPU_THERMAL = "gpu_thermal"
    GPU_THROTTLED = "gpu_throttled"
    ECC_ERRORS = "ecc_errors"
    ROW_REMAP = "row_remap"
    PCIE_DEGRADED = "pcie_degraded"
    NVLINK_DEGRADED = "nvlink_degraded"
    GPU_STRAGGLER = "gpu_straggler"
    NO_LEADER = "no_leader"
    DAEMON_DOWN = "daemon_down"
    QUORUM_LOST = "quorum_lost"
    SPLIT_BRAIN = "split_brain"
    LEADER_FLAPPING = "leader_flapping"
    PEER_PARTITIONED = "peer_partitioned"
    PEERS_NEVER_JOIN = "peers_never_join"
    BAD_IMAGE = "bad_image"
    NIC_DOWN = "nic_down"
    MODEL_MISSING = "model_missing"
    NIC_FLAPPING = "nic_flapping"
    JOB_HUNG = "job_hung"
    BARE_OOM_KILL = "bare_oom_kill"
    CHECK_FAILING = "check_failing"
    LOG_ERRORS = "log_errors"
    UNKNOWN_PEER = "unknown_peer"
    ROWS_STOPPED = "rows_stopped"


class Benign(StrEnum):
    """What a healthy fleet does, scripted like a fault: it must open no incident."""

    JOB_FINISHED = "job_finished"
    CONTAINER_STOPPED = "container_stopped"
    SHORT_DIP = "short_dip"
    CHECKPOINT_PAUSE = "checkpoint_pause"
    ROWS_IN_FREE_PAGES = "rows_in_free_pages"
    ELECTION = "election"
    PEER_JOINING = "peer_joining"
    PLANNED_RESTART = "planned_restart"
    HOT_BUT_FINE = "hot_but_fine"
    POWER_CAPPED = "power_capped"
    RETIRED_PAGE = "retired_page"
    JOBS_SAVE_ON_REQUEST = "jobs_save_on_request"
    JOBS_IGNORE_REQUESTS = "jobs_ignore_requests"
    UNCABLED_PORT = "uncabled_port"
    JOB_ACROSS_NODES = "job_across_nodes"
    JOB_CHECKPOINT = "job_checkpoint"
    JOB_ENDS_EVERYWHERE = "job_ends_everywhere"
    CHECK_UNKNOWN = "check_unknown"
    CHECKPOINT_REWRITTEN = "checkpoint_rewritten"
    LOG_ERROR_ONCE = "log_error_once"


Scripted = Fault | Benign
"""What a scenario can script: a fault, or a benign behaviour that must open no incident."""

CLUSTER = "sim"
"""The simulated peer cluster's name: leader-health's incidents about the whole cluster are on it,
and so are the whole-cluster faults' records."""
DEFAULT_XID = 79
"""XID 79: the GPU has fallen off the bus."""
DEFAULT_DISK_PATH = "/var/lib/docker"
DEFAULT_BAD_IMAGE = "registry.example/selfplay:2026.12"
DEFAULT_NCCL = "2.29.1"
"""The NCCL a job across nodes links unless its scenario says: its RAS answers in JSON."""
JOB_CAUSES = ("gpu_lost", "rank_crash", "rank_stopped", "nic_flapping")
"""What stops a rank of a job across nodes (`job_hung`'s `cause`)."""

ARGUMENT = MappingProxyType({"for": "for_s", "every": "every_s"})
"""A parameter's name as its stand-in takes it, where the scenario's name is no Python name."""
MAX_COUNT = 1000
IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,200}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$")
"""An image reference as Docker writes one (registry/name:tag, or @digest)."""


def _xid(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an XID number, got {show(value)}")
    if not 0 <= value <= 2**32 - 1:
        raise ValueError(f"{value} is not an XID (0 to 4294967295)")
    return value


def _path(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"expected an absolute path such as {DEFAULT_DISK_PATH}, got {show(value)}")
    if len(value) > 256 or "\x00" in value or "\n" in value:
        raise ValueError("a path of at most 256 characters, without NUL or newline")
    return value


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise ValueError(f"expected a number of nodes from 1 to {MAX_COUNT}, got {show(value)}")
    return value


def _image(value: object) -> str:
    if not isinstance(value, str) or not IMAGE.match(value):
        raise ValueError(f"expected an image reference such as {DEFAULT_BAD_IMAGE}, got {show(value)}")
    return value


def _cause(value: object) -> str:
    if value not in JOB_CAUSES:
        raise ValueError(f"expected one of {', '.join(JOB_CAUSES)}, got {show(value)}")
    return value


def _nccl(value: object) -> str | None:
    if value == "none":
        return None  # RAS off, or NCCL before 2.24: nothing answers on its port
    if not isinstance(value, str) or not re.fullmatch(r"2\.\d{1,3}\.\d{1,3}", value):
        raise ValueError(f"expected an NCCL version such as 2.29.1, or none, got {show(value)}")
    return value


def _seconds(value: object) -> float:
    seconds = parse_time(value)
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds


PARAMETERS: Mapping[str, Callable[[object], object]] = MappingProxyType({
    "xid": _xid, "path": _path, "count": _count, "image": _image, "cause": _cause, "nccl": _nccl,
    "for": _seconds, "every": _seconds, "after": _seconds,
})
"""Every parameter a fault may take, by name, with its check: the value its stand-in gets, or
ValueError saying what a scenario should have written. An entry naming another parameter fails
at import."""


@dataclass(frozen=True)
class Entry:
    description: str
    """What happens, for `gpumedic sim --list` and a scenario's reader; `name` for a parameter."""
    stand_in: str
    """The method that makes it happen: the node's (`SimNode`, called with the GPU where `gpu`,
    then the parameters), or the fleet's where `by` is "fleet" (called with the node, then the
    parameters). The stand-in records it in the node's `injected`."""
    expect: frozenset[K] = frozenset()
    """The incident kinds that rightly describe it; empty for what must open no node incident."""
    gpu: bool = False
    """It happens to one GPU: a scenario must name the GPU (the others refuse one)."""
    params: Mapping[str, object] = field(default_factory=dict)
    """Extra fields a scenario may give, with their defaults."""
    by: Literal["node", "fleet"] = "node"
    """Who scripts it: the node, or the fleet (the peer cluster's changes)."""
    whole_cluster: bool = False
    """A fault of the whole peer cluster: scored on `CLUSTER`, not on the node the scenario names."""
    whole_node: bool = False
    """On one GPU, but the incident it draws is the node's (a container's death: a container may
    hold several GPUs); otherwise an incident finds a GPU's fault only if it names that GPU."""

    def __post_init__(self) -> None:
        unchecked = set(self.params) - set(PARAMETERS)
        if unchecked:
            raise ValueError(f"{self.stand_in}: no check in PARAMETERS for {', '.join(sorted(unchecked))}")


def _kinds(*kinds: K) -> frozenset[K]:
    return frozenset(kinds)


FAULTS: Mapping[Scripted, Entry] = MappingProxyType({
    Fault.ZOMBIE_JOB: Entry("the job on the GPU hangs: memory held, 0 % busy, no output", "inject_zombie",
                            _kinds(K.ZOMBIE_JOB), gpu=True),
    Fault.ORPHAN_GPU_HOLDER: Entry("a process left over from a container restart holds the GPU", "inject_orphan",
                                   _kinds(K.ORPHAN_GPU_HOLDER), gpu=True),
    Fault.GPU_STUCK: Entry("on a rented pod, a leftover no signal ends holds the GPU; the pod's new run cannot start",
                           "inject_gpu_stuck", _kinds(K.ORPHAN_GPU_HOLDER), gpu=True),
    Fault.OOM_KILL: Entry("the kernel's OOM killer ends the job (exit 137)", "inject_oom_kill", _kinds(K.CONTAINER_DIED), gpu=True,
                          whole_node=True),
    Fault.BARE_OOM_KILL: Entry("the GPU's job runs on the host, outside any container, and 15 s on the host's OOM killer ends it "
                               "(exit -9): only the kernel's lines tell", "inject_bare_oom_kill", _kinds(K.CONTAINER_DIED), gpu=True,
                               whole_node=True),
    Fault.SEGFAULT: Entry("the job's container exits 139 (SIGSEGV)", "inject_segfault", _kinds(K.CONTAINER_DIED), gpu=True,
                          whole_node=True),
    Fault.SIGTERM: Entry("the job's container exits 143 (SIGTERM)", "inject_sigterm", _kinds(K.CONTAINER_DIED), gpu=True,
                         whole_node=True),
    Fault.DISK_FULL: Entry("the file system of `path` fills up", "inject_disk_full", _kinds(K.DISK_PRESSURE),
                           params={"path": DEFAULT_DISK_PATH}),
    Fault.GPU_OOM: Entry("CUDA out of memory in the container's logs, exit 1", "inject_gpu_oom", _kinds(K.CONTAINER_DIED), gpu=True,
                         whole_node=True),
    Fault.XID: Entry("the driver reports XID `xid` on the GPU", "inject_xid", _kinds(K.GPU_XID), gpu=True, params={"xid": DEFAULT_XID}),
    Fault.GPU_LOST: Entry("the GPU falls off the bus", "inject_gpu_lost", _kinds(K.GPU_LOST), gpu=True),
    Fault.SSH_REFUSES: Entry("the node's SSH refuses connections", "inject_ssh_refuses", _kinds(K.SSH_UNREACHABLE)),
    Fault.SSH_HANGS: Entry("the node's SSH accepts but never answers", "inject_ssh_hangs", _kinds(K.SSH_UNREACHABLE)),
    Fault.SAMPLER_SILENT: Entry("the node's sampler stops publishing", "inject_sampler_silent", _kinds(K.NODE_SILENT)),
    Fault.NVML_MISSING: Entry("the driver is gone: NVML cannot initialise", "inject_nvml_missing", _kinds(K.NVML_UNAVAILABLE)),
    Fault.STATUS_BLOCKED: Entry("the node's status endpoint accepts but never answers", "inject_status_blocked", _kinds(K.PEER_BLOCKED)),
    Fault.ROWS_STOPPED: Entry("the job records its games as rows in the node's SQLite database (into free pages: no file grows); "
                              "20 s on it hangs: its GPU idles and no row is added (runbook 000's game count)", "inject_rows_stopped",
                              _kinds(K.ZOMBIE_JOB), gpu=True),
    Fault.STATUS_BACKLOG: Entry("the peer daemon's event loop blocks before it accepts: connections pile up in its port's queue "
                                "until it is full (runbook 002's 26-33 pending)", "inject_status_backlog", _kinds(K.PEER_BLOCKED)),
    Fault.STATUS_SLOW: Entry("the peer daemon's event loop lags: /status answers 6 s late", "inject_status_slow", _kinds(K.SLOW_PEER)),
    Fault.PHANTOM_JOBS: Entry("the jobs' processes end, the daemons go on counting them (reset on the leader)", "inject_phantom_jobs",
                              _kinds(K.PHANTOM_JOBS)),
    Fault.STUCK_PROCESS: Entry("the node's daemon gives no job count; a 3 h old process on the GPU stops computing", "inject_stuck",
                               _kinds(K.STUCK_PROCESS), gpu=True),
    Fault.GPU_THERMAL: Entry("the GPU runs 20 C hotter (a failed fan): busy, past its slowdown temperature", "inject_gpu_thermal",
                             _kinds(K.GPU_THERMAL), gpu=True),
    Fault.GPU_THROTTLED: Entry("the board's power brake holds the busy GPU's clocks down (HW slowdown, power brake)",
                               "inject_gpu_throttled", _kinds(K.GPU_THROTTLED), gpu=True),
    Fault.ECC_ERRORS: Entry("the GPU counts a new uncorrectable (double-bit) ECC error", "inject_ecc_errors", _kinds(K.ECC_ERRORS), gpu=True),
    Fault.ROW_REMAP: Entry("a row remap waits for the GPU's reset", "inject_row_remap", _kinds(K.ROW_REMAP), gpu=True),
    Fault.PCIE_DEGRADED: Entry("the GPU's PCIe link trains down to x8 of x16", "inject_pcie_degraded", _kinds(K.PCIE_DEGRADED), gpu=True),
    Fault.NVLINK_DEGRADED: Entry("one of the GPU's 18 NVLinks goes down", "inject_nvlink_degraded", _kinds(K.NVLINK_DEGRADED), gpu=True),
    Fault.GPU_STRAGGLER: Entry("the GPU reaches only 60 % of its clocks and power under load (a failing VRM)", "inject_gpu_straggler",
                               _kinds(K.GPU_STRAGGLER), gpu=True),
    Fault.DAEMON_DOWN: Entry("the peer daemon crashes: its status port refuses connections", "inject_daemon_down", _kinds(K.PEER_DOWN)),
    Fault.NO_LEADER: Entry("every peer loses the leader while quorum holds (give the cluster's first node)", "lose_leader",
                           _kinds(K.NO_LEADER), by="fleet"),
    Fault.QUORUM_LOST: Entry("the voters lose each other: no peer has quorum or a leader, for `for`", "lose_quorum",
                             _kinds(K.QUORUM_LOST), params={"for": 60.0}, by="fleet", whole_cluster=True),
    Fault.SPLIT_BRAIN: Entry("the node and the next `count`-1 follow the node as a second leader, for `for`", "split_brain",
                             _kinds(K.SPLIT_BRAIN), params={"count": 5, "for": 60.0}, by="fleet", whole_cluster=True),
    Fault.LEADER_FLAPPING: Entry("the leader changes every `every`, round the voters, for `for`", "flap_leader",
                                 _kinds(K.LEADER_FLAPPING), params={"every": 5.0, "for": 60.0}, by="fleet", whole_cluster=True),
    Fault.PEER_PARTITIONED: Entry("behind NAT: every other peer cannot see the node, for `for`", "partition_peer",
                                  _kinds(K.PEER_PARTITIONED), params={"for": 90.0}, by="fleet"),
    Fault.PEERS_NEVER_JOIN: Entry("the node and the next `count`-1 never join the peer cluster", "keep_peers_out",
                                  _kinds(K.PEERS_BELOW_TARGET), params={"count": 5}, by="fleet", whole_cluster=True),
    Fault.UNKNOWN_PEER: Entry("a daemon named test (runbook 002's) that no inventory names joins the peer cluster, and every "
                              "member counts it", "admit_stranger", _kinds(K.UNKNOWN_PEER), by="fleet", whole_cluster=True),
    Fault.BAD_IMAGE: Entry("a rollout: the job on the GPU is restarted on `image`, which fails at start (exit 1, an import error "
                           "in its log)", "run_bad_image", _kinds(K.CONTAINER_DIED), gpu=True,
                           params={"image": DEFAULT_BAD_IMAGE}, whole_node=True),
    Fault.NIC_DOWN: Entry("the node's InfiniBand fabric (four ports, up) loses one port `after` seconds on: its cable pulled",
                          "inject_nic_down", _kinds(K.NIC_DEGRADED), params={"after": 15.0}),
    Fault.MODEL_MISSING: Entry("the node's copy of the model every node must have is gone (a sync that never reached it)",
                               "inject_model_missing", _kinds(K.FILE_MISSING)),
    Fault.CHECK_FAILING: Entry("the node's job checkpoint directory is emptied: the operator's own check of it (runbook 002's "
                               "missing network checkpoints) says 'problem'", "inject_check_failing", _kinds(K.CHECK_FAILED)),
    Fault.LOG_ERRORS: Entry("the node's worker logs 5 lines of runbook 001's recurring errors (SSH connection failed, failed to "
                            "reset orphaned tasks) at once: the operator's log pattern counts them", "inject_log_errors",
                            _kinds(K.LOG_PATTERN)),
    Fault.NIC_FLAPPING: Entry("one of the node's InfiniBand links goes down and back every `every` seconds, counting errors",
                              "inject_nic_flapping", _kinds(K.NIC_FLAPPING), params={"every": 20.0}),
    Fault.JOB_HUNG: Entry("the node's ranks of its job across nodes stop, and every other rank waits in the collective; `cause`: "
                          "gpu_lost (its GPU 0 falls off the bus), rank_crash (its rank on GPU 0 dies of SIGSEGV), rank_stopped (its rank "
                          "on GPU 0 stops without exiting: only NCCL's RAS tells) or nic_flapping (a fabric link flaps every `every` s; "
                          "the job hangs at the first flap)", "hang_job", _kinds(K.JOB_HUNG),
                          params={"cause": "gpu_lost", "every": 10.0}, by="fleet"),
    Benign.JOB_FINISHED: Entry("benign: the job is done, exit 0, the GPU free", "finish_job", gpu=True),
    Benign.CONTAINER_STOPPED: Entry("benign: the node stops the job's container (docker stop, exit 143)", "stop_job", gpu=True),
    Benign.SHORT_DIP: Entry("benign: the job stops computing for `for` (default 10s), then goes on", "dip_job", gpu=True,
                            params={"for": 10.0}),
    Benign.CHECKPOINT_PAUSE: Entry("benign: the GPU idles for `for` (default 60s) while output still grows", "checkpoint_job", gpu=True,
                                   params={"for": 60.0}),
    Benign.ROWS_IN_FREE_PAGES: Entry("benign: the job records its games as rows and its GPU idles for `for` (default 60s) in a CPU "
                                     "phase while games still go into the database's free pages: no byte grows, only the rows",
                                     "rows_cpu_phase", gpu=True, params={"for": 60.0}),
    Benign.ELECTION: Entry("benign: the leader steps down; 3s later the node leads", "hold_election", by="fleet"),
    Benign.PEER_JOINING: Entry("benign: the node's peer daemon joins the cluster anew", "join_peer", by="fleet"),
    Benign.PLANNED_RESTART: Entry("benign: the node's peer daemon restarts (down for `for`, default 3s)", "restart_peer",
                                  params={"for": 3.0}, by="fleet"),
    Benign.HOT_BUT_FINE: Entry("benign: the busy GPU runs at 83 C, below its 89 C slowdown temperature", "run_hot", gpu=True),
    Benign.POWER_CAPPED: Entry("benign: the operator caps the GPU at 400 W; busy, it runs slower under SW power cap", "cap_power", gpu=True),
    Benign.RETIRED_PAGE: Entry("benign: the GPU has one page retired long ago, and stays at one", "retire_page", gpu=True),
    Benign.JOBS_SAVE_ON_REQUEST: Entry("benign: from now the node's jobs, asked to checkpoint, save (3s), then exit on the signal "
                                       "or remove the file", "jobs_save_on_request"),
    Benign.UNCABLED_PORT: Entry("benign: the node's InfiniBand fabric has a port nobody cabled (down from the start)",
                                "cable_one_port_less"),
    Benign.JOB_ACROSS_NODES: Entry("benign: the node and the next `count`-1 run one torchrun job across nodes, a rank on every GPU, "
                                   "linking NCCL `nccl` (its RAS answers JSON from 2.28.7, text before; none: RAS off)",
                                   "run_job_across", params={"count": 4, "nccl": DEFAULT_NCCL}, by="fleet"),
    Benign.JOB_CHECKPOINT: Entry("benign: the node's job across nodes checkpoints for `for`: rank 0 writes, every other rank waits",
                                 "checkpoint_job_across", params={"for": 90.0}, by="fleet"),
    Benign.JOB_ENDS_EVERYWHERE: Entry("benign: the node's job across nodes is done: every rank exits 0, on every node", "end_job_across",
                                      by="fleet"),
    Benign.CHECK_UNKNOWN: Entry("benign: the node has no checkpoint directory at all, so the operator's check of it cannot tell "
                                "(exit 2)", "unset_checkpoints"),
    Benign.CHECKPOINT_REWRITTEN: Entry("benign: the job writes its checkpoint anew: the old one is gone for `for` (default 6s), "
                                       "shorter than the check's interval", "rewrite_checkpoint", params={"for": 6.0}),
    Benign.LOG_ERROR_ONCE: Entry("benign: the worker logs one authentication failure among its ordinary lines, and retries",
                                 "log_error_once"),
    Benign.JOBS_IGNORE_REQUESTS: Entry("benign: from now the node's jobs ignore a request to checkpoint (they handle the signal "
                                       "and do nothing)", "jobs_ignore_requests"),
})


class InjectedFault(NamedTuple):
    """Ground truth: what was broken (or done, for benign behaviour), where and when (UTC), and the
    incident kinds that rightly describe it, to score detectors against."""

    at: datetime
    node_id: str
    gpu: int | None
    fault: str
    expect: frozenset[str] = frozenset()


def expected(fault: str) -> frozenset[str]:
    """The kinds that rightly describe `fault` as its entry gives them (a stand-in may know better:
    an XID's number decides what it means)."""
    return frozenset(FAULTS[fault].expect)
