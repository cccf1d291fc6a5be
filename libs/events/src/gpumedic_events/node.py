"""What a node-sampler says about its node: one message per node per interval, all GPUs in it."""

from __future__ import annotations

import hashlib
from enum import IntFlag, StrEnum
from typing import ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpumedic_events.base import Event, NodeId

_EXAMPLE_PROCESS = {
    "pid": 41230,
    "start_ticks": 8812345,
    "command": "python train.py --epochs 90",
    "user": "ml",
    "started_at": "2026-11-22T08:02:11Z",
    "age_s": 7969.0,
    "cgroup": "/system.slice/docker-3f9c2a7d4b1e8f6a0c5d2e9b7a4f1c8d3e6b9a2f5c8e1d4a7b0c3f6e9d2a5b8c.scope",
    "container_id": "3f9c2a7d4b1e8f6a0c5d2e9b7a4f1c8d3e6b9a2f5c8e1d4a7b0c3f6e9d2a5b8c",
    "container_exists": True,
    "used_memory_mib": 20480,
    "job": {"id": "torchelastic:llama-ft-0412", "rank": 3, "world_size": 8, "local_world_size": 8, "nodes": 1},
}


class ProcessIdentity(BaseModel):
    """Who a process on the node is: enough to find it, judge it and kill exactly it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    pid: int = Field(ge=1, le=4_194_304, description="Process id on the node.")
    start_ticks: int | None = Field(
        default=None,
        ge=0,
        description="Start time in clock ticks since boot (/proc/PID/stat field 22). With the pid it "
        "identifies the process, so a recycled pid is never mistaken for it.",
    )
    command: str = Field(default="", max_length=4096, description="Command line, arguments joined by spaces.")
    user: str = Field(default="", max_length=64, description="Owner: the user name, or the numeric uid if unnamed.")
    started_at: AwareDatetime | None = Field(default=None, description="When the process started (UTC).")
    age_s: float | None = Field(default=None, ge=0, description="Seconds since it started, at sample time.")
    cgroup: str = Field(default="", max_length=512, description="Its cgroup path (/proc/PID/cgroup).")
    container_id: str = Field(
        default="", max_length=128, description="Id of the container whose cgroup it runs in; empty if none."
    )
    container_exists: bool | None = Field(
        default=None,
        description="Whether the container engine still knows that container; None if not in a "
        "container or no engine could be asked. False is a leftover from a container that is gone.",
    )


JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,199}$"


def job_key(job_id: str) -> str:
    """A job's key among incidents (job_hung's): a digest, since its id may hold what a bus key may not."""
    return "job-" + hashlib.blake2s(job_id.encode(), digest_size=8).hexdigest()


class JobTag(BaseModel):
    """What ties a GPU process to a job that may span nodes, as its launcher told the process
    (torchrun's, Slurm's or MPI's environment, or a variable the operator names): the same `id` on
    several nodes is one job, and `rank` says which of its processes this is."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(
        pattern=JOB_ID_PATTERN,
        description="The job, prefixed by where the id came from: label:<the operator's variable>, torchelastic:<TORCHELASTIC_RUN_ID>, "
        "slurm:<SLURM_JOB_ID>[.<SLURM_STEP_ID>], or rendezvous:<MASTER_ADDR>:<MASTER_PORT> (never a loopback address).",
    )
    rank: int | None = Field(default=None, ge=0, le=1_000_000, description="The process's global rank (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK).")
    world_size: int | None = Field(default=None, ge=1, le=1_000_000, description="How many ranks the job has in all.")
    local_world_size: int | None = Field(default=None, ge=1, le=1_000_000, description="How many of them run on this node.")
    nodes: int | None = Field(default=None, ge=1, le=100_000, description="How many nodes the job runs on (GROUP_WORLD_SIZE, SLURM_JOB_NUM_NODES).")

    @property
    def spans_nodes(self) -> bool:
        """The launcher says the job has ranks on other nodes too."""
        if self.nodes is not None:
            return self.nodes > 1
        return self.world_size is not None and self.local_world_size is not None and self.world_size > self.local_world_size


class GpuProcess(ProcessIdentity):
    """A process with a compute context on a GPU."""

    model_config = ConfigDict(json_schema_extra={"examples": [_EXAMPLE_PROCESS]})

    used_memory_mib: int | None = Field(default=None, ge=0, description="GPU memory this process holds, MiB.")
    write_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Bytes it has caused to be written to storage since it started (/proc/PID/io "
        "write_bytes); growth between samples is this process's own output. None if unreadable "
        "(the sampler needs root, or the same user, to read it).",
    )
    job: JobTag | None = Field(
        default=None,
        description="The job it is a rank of, from its environment (/proc/PID/environ, read only for these variables); "
        "None when it carries none, or the sampler may not read it.",
    )


class DeviceHolder(ProcessIdentity):
    """A process holding a /dev/nvidia* file open without a compute context: `nvidia-smi` does not
    list it, yet it can keep the next job from getting the device."""

    devices: tuple[str, ...] = Field(
        default=(), max_length=80, description="The /dev/nvidia* files it holds open, e.g. /dev/nvidia0."
    )


class ComputeMode(StrEnum):
    """NVML compute mode: who may create a context on the GPU."""

    DEFAULT = "default"
    EXCLUSIVE_THREAD = "exclusive_thread"
    PROHIBITED = "prohibited"
    EXCLUSIVE_PROCESS = "exclusive_process"


class ClockEventReason(IntFlag):
    """Why a GPU's clocks are held down: NVML's clocks event (throttle) reasons, as bits of
    `GpuSample.clock_event_reasons` (nvml.h's nvmlClocksEventReason*, DCGM's
    DCGM_FI_DEV_CLOCKS_EVENT_REASONS). Only the hardware slowdowns and the thermal ones are
    faults: a busy GPU at its power limit shows SW_POWER_CAP, an idle one GPU_IDLE."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


class NvLinkSample(BaseModel):
    """One NVLink of a GPU: whether it is up and its error counters since the driver loaded."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    link: int = Field(ge=0, le=63, description="NVLink index on the GPU.")
    up: bool = Field(description="NVML: the link is active.")
    replay_errors: int | None = Field(default=None, ge=0, description="Data link replays (NVML_NVLINK_ERROR_DL_REPLAY).")
    recovery_errors: int | None = Field(
        default=None, ge=0, description="Data link recoveries (NVML_NVLINK_ERROR_DL_RECOVERY)."
    )
    crc_errors: int | None = Field(
        default=None, ge=0, description="CRC errors in flits and in data (NVML_NVLINK_ERROR_DL_CRC_FLIT + _CRC_DATA)."
    )


class GpuHealth(BaseModel):
    """A GPU's figures that rarely change: maxima, thresholds, running totals, the PCIe link and
    the NVLinks. The sampler reads and sends them at a slower cadence than the sample (every
    `health_interval_s`, and in a node's first sample); until the next one comes, the last one a
    consumer saw for the GPU holds. None: the GPU or driver does not have the figure."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    sm_clock_max_mhz: int | None = Field(default=None, ge=0, description="Maximum SM clock, MHz.")
    memory_clock_mhz: int | None = Field(default=None, ge=0, description="Memory clock now, MHz.")
    memory_clock_max_mhz: int | None = Field(default=None, ge=0, description="Maximum memory clock, MHz.")
    temperature_slowdown_c: int | None = Field(
        default=None, ge=-50, le=200, description="The core temperature at which the GPU slows itself down, Celsius."
    )
    temperature_shutdown_c: int | None = Field(
        default=None, ge=-50, le=200, description="The core temperature at which the GPU shuts down, Celsius."
    )
    temperature_max_operating_c: int | None = Field(
        default=None, ge=-50, le=200, description="The highest core temperature for normal operation, Celsius."
    )
    memory_temperature_max_c: int | None = Field(
        default=None, ge=-50, le=200, description="The highest memory temperature for normal operation, Celsius."
    )
    pcie_link_gen: int | None = Field(default=None, ge=0, le=16, description="PCIe link generation now.")
    pcie_link_gen_max: int | None = Field(
        default=None, ge=0, le=16, description="The highest PCIe generation this GPU and its slot can run."
    )
    pcie_link_width: int | None = Field(default=None, ge=0, le=64, description="PCIe lanes now.")
    pcie_link_width_max: int | None = Field(default=None, ge=0, le=64, description="The most PCIe lanes possible.")
    pcie_replay_count: int | None = Field(default=None, ge=0, description="PCIe replays since the driver loaded.")
    ecc_corrected_aggregate: int | None = Field(
        default=None, ge=0, description="Corrected ECC errors over the GPU's life."
    )
    ecc_uncorrected_aggregate: int | None = Field(
        default=None, ge=0, description="Uncorrected ECC errors over the GPU's life."
    )
    remapped_rows_corrected: int | None = Field(
        default=None, ge=0, description="Rows remapped for correctable errors (Ampere and later)."
    )
    remapped_rows_uncorrected: int | None = Field(
        default=None, ge=0, description="Rows remapped for uncorrectable errors (Ampere and later)."
    )
    retired_pages: int | None = Field(
        default=None, ge=0, description="Pages retired for single- and double-bit errors (before Ampere)."
    )
    fan_speed_pct: int | None = Field(default=None, ge=0, le=200, description="Fan speed, percent of its maximum.")
    nvlink_count: int | None = Field(
        default=None, ge=0, le=64, description="How many NVLinks the GPU has (0: PCIe only); None if unread."
    )
    nvlinks: tuple[NvLinkSample, ...] = Field(
        default=(),
        max_length=64,
        description="The NVLinks that are down or have counted errors; a healthy link is left out.",
    )


class GpuSample(BaseModel):
    """One GPU as NVML reported it at sample time."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    index: int = Field(ge=0, le=63, description="NVML device index.")
    uuid: str = Field(default="", max_length=96, description="NVML device UUID.")
    name: str = Field(default="", max_length=96, description="Product name.")
    utilization_gpu_pct: int | None = Field(
        default=None, ge=0, le=100, description="Share of the last sample period a kernel ran; None if unread."
    )
    utilization_memory_pct: int | None = Field(default=None, ge=0, le=100, description="Memory controller busy share.")
    memory_used_mib: int | None = Field(default=None, ge=0, description="Device memory in use, MiB.")
    memory_total_mib: int | None = Field(default=None, ge=0, description="Device memory in all, MiB.")
    processes: tuple[GpuProcess, ...] = Field(default=(), max_length=256, description="Compute processes.")
    temperature_c: int | None = Field(default=None, ge=-50, le=200, description="Core temperature, Celsius.")
    power_w: float | None = Field(default=None, ge=0, description="Power draw, watts.")
    power_limit_w: float | None = Field(default=None, ge=0, description="Enforced power limit, watts.")
    ecc_uncorrected_volatile: int | None = Field(
        default=None, ge=0, description="Uncorrected ECC errors since the driver loaded; None if ECC is off or unsupported."
    )
    ecc_corrected_volatile: int | None = Field(
        default=None, ge=0, description="Corrected ECC errors since the driver loaded."
    )
    retired_pages_pending: bool | None = Field(
        default=None, description="Pages wait to be retired at the next reset (pre-Ampere); None if unsupported."
    )
    remapped_rows_pending: bool | None = Field(
        default=None, description="Row remaps wait for the next reset (Ampere and later); None if unsupported."
    )
    remapped_rows_failed: bool | None = Field(
        default=None, description="A row remap failed: the GPU needs service."
    )
    compute_mode: ComputeMode | None = Field(default=None, description="NVML compute mode.")
    lost: bool = Field(default=False, description="NVML says the GPU fell off the bus (GPU is lost).")
    sm_clock_mhz: int | None = Field(default=None, ge=0, description="SM clock now, MHz.")
    clock_event_reasons: int | None = Field(
        default=None, ge=0, description="Why the clocks are held down now: a bit set of ClockEventReason."
    )
    memory_temperature_c: int | None = Field(
        default=None, ge=-50, le=200, description="Memory (HBM) temperature, Celsius; None where the GPU has no sensor."
    )
    health: GpuHealth | None = Field(
        default=None, description="The slowly changing figures, in some samples only (see GpuHealth)."
    )


class JobsObservation(BaseModel):
    """What the node's job probes said: how many jobs it runs and whether their output grows."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    running: int | None = Field(default=None, ge=0, description="Jobs the node reports running; None if unprobed.")
    output_growing: bool | None = Field(
        default=None, description="Whether watched outputs grew since the last sample; None if none are watched."
    )


class DiskUsage(BaseModel):
    """One configured path's file system."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    path: str = Field(max_length=256, description="The configured path, e.g. /var/lib/docker.")
    total_bytes: int = Field(ge=0, description="Size of its file system.")
    used_bytes: int = Field(ge=0, description="Bytes in use.")
    available_bytes: int = Field(ge=0, description="Bytes an unprivileged writer can still use.")
    used_pct: float = Field(ge=0, le=100, description="Share in use as `df` shows it: used / (used + available).")


class IbPort(BaseModel):
    """One InfiniBand or RoCE port as the kernel shows it under /sys/class/infiniband/<device>/ports/<port>
    (Documentation/ABI/stable/sysfs-class-infiniband); None where the file was missing or odd."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    device: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="The RDMA device, e.g. mlx5_0.")
    port: int = Field(ge=0, le=255)
    state: str | None = Field(default=None, max_length=32, description="DOWN, INIT, ARMED, ACTIVE or ACTIVE_DEFER.")
    phys_state: str | None = Field(default=None, max_length=32, description="Sleep, Polling, Disabled, LinkUp, LinkErrorRecovery, ...")
    rate_gbps: float | None = Field(default=None, ge=0, le=100_000, description="The active rate, e.g. 400 for '400 Gb/sec (4X NDR)'.")
    link_layer: Literal["InfiniBand", "Ethernet"] | None = Field(default=None, description="Ethernet: RoCE.")
    link_downed: int | None = Field(default=None, ge=0, description="Times the link training failed and the link went down.")
    link_error_recovery: int | None = Field(default=None, ge=0, description="Times the link recovered from an error.")
    symbol_error: int | None = Field(default=None, ge=0, description="Minor link errors on the physical lanes.")
    port_rcv_errors: int | None = Field(default=None, ge=0, description="Packets received with an error.")
    local_link_integrity_errors: int | None = Field(default=None, ge=0)
    excessive_buffer_overrun_errors: int | None = Field(default=None, ge=0)
    port_xmit_discards: int | None = Field(default=None, ge=0, description="Outbound packets dropped: the port down or congested.")


class TopProcess(BaseModel):
    """One of the host's busiest processes by CPU or by memory, as `top` would rank them."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    pid: int = Field(ge=1, le=4_194_304, description="Process id on the node.")
    command: str = Field(default="", max_length=256, description="Command line, cut at 256 characters.")
    user: str = Field(default="", max_length=64, description="Owner: the user name, or the numeric uid if unnamed.")
    container_id: str = Field(default="", max_length=128, description="Its container's id; empty if none.")
    cpu_pct: float = Field(
        ge=0, description="CPU use over the sampler's last look, percent of one CPU (400 is four CPUs busy)."
    )
    memory_rss_mib: int = Field(ge=0, description="Resident memory, MiB.")


class ContainerUsage(BaseModel):
    """One running container's CPU and memory, as `docker stats` shows them: its cgroup's counters."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    container_id: str = Field(min_length=12, max_length=128, description="The engine's id of the container.")
    cpu_pct: float = Field(ge=0, description="CPU use over the sampler's last look, percent of one CPU (400 is four CPUs busy).")
    memory_mib: int = Field(ge=0, description="Memory charged to it now (memory.current: its processes' and its page cache), MiB.")
    memory_limit_mib: int | None = Field(default=None, ge=0, description="Its memory limit (memory.max), MiB; None: none.")


class CpuPressure(BaseModel):
    """The kernel's CPU pressure stall information (PSI, the kernel's `accounting/psi` page), over its
    last 10 seconds: the share of time some runnable task waited for a CPU (`some`), and the share
    every non-idle task did at once (`full`). A training node's data loaders keep `some` high; that is
    why its sampler is late, not a reason to think it dead."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    some_avg10_pct: float = Field(ge=0, le=100, description="`some avg10`: % of the last 10 s some task waited for a CPU.")
    full_avg10_pct: float | None = Field(
        default=None, ge=0, le=100, description="`full avg10`: % of the last 10 s every non-idle task waited at once; None "
        "where the kernel writes no `full` line for CPU (before 5.13).",
    )


class HostSample(BaseModel):
    """The host around the GPUs: memory, swap, load and the disks the jobs write to."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    memory_total_mib: int | None = Field(default=None, ge=0, description="MemTotal, MiB.")
    memory_available_mib: int | None = Field(default=None, ge=0, description="MemAvailable, MiB.")
    swap_total_mib: int | None = Field(default=None, ge=0, description="SwapTotal, MiB.")
    swap_used_mib: int | None = Field(default=None, ge=0, description="SwapTotal - SwapFree, MiB.")
    load_1m: float | None = Field(default=None, ge=0, description="Load average over 1 minute.")
    load_5m: float | None = Field(default=None, ge=0, description="Load average over 5 minutes.")
    load_15m: float | None = Field(default=None, ge=0, description="Load average over 15 minutes.")
    cpus: int | None = Field(default=None, ge=1, description="Online CPUs, to read the load against.")
    cpu_pressure: CpuPressure | None = Field(
        default=None, description="The node's CPU pressure (/proc/pressure/cpu); None where the kernel has no PSI."
    )
    disks: tuple[DiskUsage, ...] = Field(default=(), max_length=32, description="Usage of each configured path.")
    top_processes: tuple[TopProcess, ...] = Field(
        default=(),
        max_length=16,
        description="The busiest processes by CPU and by resident memory (five of each, fewer where they "
        "overlap), from the sampler's look at every process: carried by the sample after each look (every "
        "30 s by default) and empty in the samples between.",
    )
    containers: tuple[ContainerUsage, ...] = Field(
        default=(), max_length=64, description="Each running container's CPU and memory (runbook 004's `docker stats`), the "
        "busiest by memory first: carried with the busiest processes after each look, empty in the samples between.",
    )
    ib_ports: tuple[IbPort, ...] = Field(
        default=(), max_length=32, description="Its InfiniBand and RoCE ports (none on a node without RDMA devices)."
    )


RAS_HOST_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.:%_-]{0,252}$"
"""A host as NCCL's RAS names it: an address (IPv4, IPv6) or a name."""


class RasRank(BaseModel):
    """A rank NCCL's RAS got no answer from, as one query of it said (its JSON `missing_ranks`, or
    its text's missing rank and process lines)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rank: int | None = Field(default=None, ge=0, le=1_000_000, description="Its rank in the communicator; None where only "
                             "its process was named.")
    communicator_size: int | None = Field(default=None, ge=1, le=1_000_000, description="How many ranks that communicator has "
                                          "(a job's whole-world communicator has its world size).")
    host: str | None = Field(default=None, pattern=RAS_HOST_PATTERN, description="The node it runs on, as RAS names it "
                             "(the address of NCCL's bootstrap interface).")
    pid: int | None = Field(default=None, ge=1, le=4_194_304, description="Its process, as that process sees itself "
                            "(a container's own pid namespace).")
    gpu: int | None = Field(default=None, ge=0, le=63, description="Its GPU's NVML index (nvml_dev).")
    dead: bool = Field(default=False, description="RAS gave up on it: unreachable for 60 s (considered dead); "
                       "otherwise unresponsive to this query.")


class FileFact(BaseModel):
    """A file the node must have (node-sampler's GPUMEDIC_SAMPLER_EXPECT_FILES: the canonical models
    every node needs, runbook 002), as the sampler found it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    path: str = Field(min_length=1, max_length=4096)
    present: bool | None = Field(description="Whether it is there as a regular file; None: it could not be told (`error`).")
    size: int | None = Field(default=None, ge=0)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", description="Its digest, once read (a file is read "
                               "again only when its size or modification time changed); None until then.")
    error: str | None = Field(default=None, max_length=300, description="Why it could not be told (permission, not a file).")


CHECK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
"""An operator's check is named by its script's file name without its extension (`nfs-mounted.sh`
is `nfs-mounted`): no directory, no hidden file, and a part of an incident's fingerprint."""


class CheckFact(BaseModel):
    """The last result of one of the operator's own check scripts on the node (node-sampler's
    GPUMEDIC_SAMPLER_CHECKS_DIR), under node-problem-detector's contract: exit 0 ok, 1 a problem,
    anything else (2, a timeout, a script that cannot run) unknown; the first line it prints says why."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(pattern=CHECK_NAME)
    status: Literal["ok", "problem", "unknown"]
    message: str = Field(default="", max_length=256, description="The first line the script printed (masked), or why it did not run.")
    ran_at: AwareDatetime = Field(description="When this result was taken (the node's clock).")


class LogMatches(BaseModel):
    """One of the operator's log patterns (node-sampler's GPUMEDIC_SAMPLER_LOG_PATTERNS): how many
    lines of its sources matched since the sampler started, and the last one (masked)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(pattern=CHECK_NAME)
    count: int = Field(ge=0, description="Matching lines since the sampler started: a smaller count than before is a restart.")
    last_line: str = Field(default="", max_length=256)
    error: str | None = Field(default=None, max_length=300, description="Which of its sources cannot be read now, and why.")


class NcclRasAnswer(BaseModel):
    """What NCCL's RAS (NCCL 2.24 and later) said when the sampler asked it on the node's loopback
    port: only while the ranks of a job here sit idle, and only the ranks it could not reach."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    asked_at: AwareDatetime = Field(description="When the sampler asked (the node's clock).")
    nccl_version: str | None = Field(default=None, pattern=r"^[0-9][0-9A-Za-z.+~-]{0,31}$", description="The job's NCCL, "
                                     "as RAS said it.")
    output: Literal["json", "text"] | None = Field(default=None, description="The form RAS answered in: json from NCCL "
                                                   "2.28.7, text before; None when it did not answer.")
    communicators: int | None = Field(default=None, ge=0, description="Communicators it reported on.")
    missing: tuple[RasRank, ...] = Field(default=(), max_length=64, description="The ranks (or processes) it could not "
                                         "reach, the first 64.")
    missing_count: int = Field(default=0, ge=0, description="How many it could not reach in all.")
    error: str | None = Field(default=None, max_length=300, description="Why it could not be asked or read (nothing "
                              "listening: NCCL older than 2.24, NCCL_RAS_ENABLE=0 or another NCCL_RAS_ADDR; no answer "
                              "in time: the process holding the port is stopped itself).")


class NodeSampled(Event):
    """One node's periodic sample: every GPU, its processes, and the job probes."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.node.sampled"
    subject_key: ClassVar[str | None] = "node_id"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "7d0f4a4e-4b8e-4a53-9f8a-2d0f3c1b6a11",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:00Z",
                    "source": "node-sampler",
                    "node_id": "gpu-node-07",
                    "interval_s": 5.0,
                    "gpus": [
                        {
                            "index": 0,
                            "uuid": "GPU-5f1c2a7e-0000-4000-8000-000000000007",
                            "name": "NVIDIA H100 80GB HBM3",
                            "utilization_gpu_pct": 0,
                            "utilization_memory_pct": 0,
                            "memory_used_mib": 20512,
                            "memory_total_mib": 81559,
                            "processes": [_EXAMPLE_PROCESS],
                            "temperature_c": 41,
                            "power_w": 71.5,
                            "power_limit_w": 700.0,
                            "ecc_uncorrected_volatile": 0,
                            "ecc_corrected_volatile": 0,
                            "retired_pages_pending": None,
                            "remapped_rows_pending": False,
                            "remapped_rows_failed": False,
                            "compute_mode": "default",
                            "lost": False,
                            "sm_clock_mhz": 345,
                            "clock_event_reasons": 1,
                            "memory_temperature_c": 34,
                            "health": {
                                "sm_clock_max_mhz": 1980,
                                "memory_clock_mhz": 2619,
                                "memory_clock_max_mhz": 2619,
                                "temperature_slowdown_c": 89,
                                "temperature_shutdown_c": 95,
                                "temperature_max_operating_c": 87,
                                "memory_temperature_max_c": 95,
                                "pcie_link_gen": 5,
                                "pcie_link_gen_max": 5,
                                "pcie_link_width": 16,
                                "pcie_link_width_max": 16,
                                "pcie_replay_count": 0,
                                "ecc_corrected_aggregate": 0,
                                "ecc_uncorrected_aggregate": 0,
                                "remapped_rows_corrected": 0,
                                "remapped_rows_uncorrected": 0,
                                "retired_pages": None,
                                "fan_speed_pct": None,
                                "nvlink_count": 18,
                                "nvlinks": [{"link": 7, "up": True, "replay_errors": 0, "recovery_errors": 0, "crc_errors": 3}],
                            },
                        }
                    ],
                    "device_holders": [
                        {
                            "pid": 39877,
                            "start_ticks": 8790012,
                            "command": "python -m selfplay.worker --gpu 0 --resume",
                            "user": "ml",
                            "started_at": "2026-11-22T07:58:30Z",
                            "age_s": 8190.0,
                            "cgroup": "/system.slice/docker-9a1b.scope",
                            "container_id": "9a1b",
                            "container_exists": False,
                            "devices": ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"],
                        }
                    ],
                    "host": {
                        "memory_total_mib": 2063672,
                        "memory_available_mib": 1802331,
                        "swap_total_mib": 0,
                        "swap_used_mib": 0,
                        "load_1m": 12.4,
                        "load_5m": 11.9,
                        "load_15m": 11.7,
                        "cpus": 224,
                        "cpu_pressure": {"some_avg10_pct": 61.2, "full_avg10_pct": 0.0},
                        "disks": [
                            {
                                "path": "/var/lib/docker",
                                "total_bytes": 3840755982336,
                                "used_bytes": 1920377991168,
                                "available_bytes": 1920377991168,
                                "used_pct": 50.0,
                            }
                        ],
                    },
                    "jobs": {"running": 1, "output_growing": False},
                    "due_at": "2026-11-22T10:14:59.998Z",
                    "missed_ticks": 0,
                    "errors": [],
                }
            ]
        }
    )

    node_id: NodeId
    interval_s: float = Field(gt=0, le=3600, description="The sampling interval the sampler runs at, seconds.")
    gpus: tuple[GpuSample, ...] = Field(default=(), max_length=64, description="Every GPU of the node.")
    device_holders: tuple[DeviceHolder, ...] = Field(
        default=(),
        max_length=256,
        description="Processes holding /dev/nvidia* open without a compute context on any GPU, as of the "
        "last scan of /proc (which runs less often than sampling; see the sampler's holder_scan_interval_s).",
    )
    host: HostSample = Field(default_factory=HostSample, description="Memory, swap, load and disks.")
    jobs: JobsObservation = Field(default_factory=JobsObservation, description="Job probe results.")
    due_at: AwareDatetime | None = Field(
        default=None, description="When this sample was due by the sampler's own schedule (its grid of one tick per "
        "interval). `occurred_at` is when it was taken: the difference is how late the sampler was, a busy node's CPUs "
        "being taken by its job. The next sample is due one interval after this. None from samplers before 2026-12.",
    )
    missed_ticks: int = Field(
        default=0, ge=0, le=1_000_000, description="Ticks the sampler skipped since its previous sample (it fell so far "
        "behind that their time had passed): the gap before this sample is the node's lateness, not silence.",
    )
    sampler_cpu_pressure: CpuPressure | None = Field(
        default=None, description="The CPU pressure of the sampler's own cgroup (its cgroup v2 `cpu.pressure`): how much "
        "the sampler itself waited for a CPU. None outside a cgroup v2 group of its own.",
    )
    unacknowledged: int = Field(
        default=0, ge=0, description="Samples this sampler sent since it started that the bus did not acknowledge (it only "
        "grows): what the control plane never got, said by the node itself in its next sample.",
    )
    errors: tuple[str, ...] = Field(
        default=(),
        max_length=64,
        description="What could not be read this time (the sample still carries what was known).",
    )
    nvml_error: str | None = Field(
        default=None,
        max_length=300,
        description="Why NVML could not be used at all this time (driver missing or broken): the sample has no "
        "GPUs then. None when NVML answered, whatever single queries failed.",
    )
    nccl_ras: NcclRasAnswer | None = Field(
        default=None,
        description="NCCL's RAS, asked while the ranks of a job on this node sit idle (the latest answer, in every "
        "sample until they work again); None when not asked.",
    )
    files: tuple[FileFact, ...] = Field(
        default=(), max_length=64, description="The files the node must have, as found (none when none are expected)."
    )
    checks: tuple[CheckFact, ...] = Field(
        default=(), max_length=64, description="The operator's own checks on the node, each its last result (none when none are set)."
    )
    logs: tuple[LogMatches, ...] = Field(
        default=(), max_length=32, description="The operator's log patterns on the node, each its count (none when none are set)."
    )
