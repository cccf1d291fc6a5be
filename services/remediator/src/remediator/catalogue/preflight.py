"""Pre-flight's read-only look at a node's GPUs: is each free and healthy for the next job?

It replaces the launch script that runs `pkill -9`, `fuser -k /dev/nvidia*` and a GPU reset
blindly before every job. Nothing here changes the node: one `nvidia-smi` query for every GPU's
utilisation, memory and compute mode, then per GPU its compute processes (NVML) and the processes
holding its device file (`fuser`, which sees a leftover without a CUDA context that NVML does
not), each named by its /proc/PID/stat. A GPU is ready when it answers, lets jobs in (compute mode
not Prohibited), runs no compute process, is held by nothing but known daemons, and uses at most
the policy's memory. `leftovers` says, for a GPU that is not ready, the processes a clean would
kill and why it must not when it must not.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumedic_events import GpuReadiness, ProcessTarget
from gpumedic_events.redact import redact
from gpumedic_incidents.policy import PreflightPolicy
from remediator.catalogue.base import Node, said
from remediator.catalogue.gpu import NO_PROCESS, apps_command, holders_command, parse_pids
from remediator.catalogue.kill import cmdline_command, parse_cmdline, parse_stat, stat_command

GPU_STATE = "nvidia-smi --query-gpu=index,utilization.gpu,memory.used,compute_mode --format=csv,noheader,nounits"
DISK_FREE = "df --block-size=1 --output=avail,target /var/lib/docker /"
"""Free bytes on Docker's data directory and on /: where a job's images and logs go (a node without Docker has only /)."""
MEMORY = "grep MemAvailable: /proc/meminfo"
PROHIBITED = "Prohibited"
EXCLUSIVE_PROCESS = "Exclusive_Process"
"""One context at a time: whatever holds the GPU leaves the next job "CUDA-capable device is busy or unavailable"."""


class NoGpuState(Exception):
    """nvidia-smi cannot list the node's GPUs at all; the message says what it answered."""


@dataclass(frozen=True)
class GpuLook:
    """One GPU's readiness, and what a clean would need to know about it."""

    readiness: GpuReadiness
    processes: dict[int, str]
    """Every pid in the way (compute or holder), with its comm."""
    answers: bool
    """NVML answered for it; a GPU that does not is a person's problem, never a clean's."""


async def inspect(node: Node, gpus: tuple[int, ...] | None, policy: PreflightPolicy) -> list[GpuLook]:
    """Each requested GPU (every GPU when None) as the node shows it now. Raises nothing but what
    the node's runner raises; a command that fails becomes a problem of the GPUs it concerns."""
    state = await node.run(GPU_STATE)
    rows: dict[int, list[str]] = {}
    failure = ""
    if state.exit_status != 0:
        failure = f"nvidia-smi fails on the node ({said(state)})"
    else:
        for line in state.stdout.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 4 and fields[0].isdigit():
                rows[int(fields[0])] = fields[1:]
    if gpus is None and failure:
        raise NoGpuState(failure)  # no GPU to pin the failure on
    wanted = gpus if gpus is not None else tuple(sorted(rows))
    return [await _look(node, gpu, rows.get(gpu), failure, sorted(rows), policy) for gpu in wanted]


async def _look(
    node: Node, gpu: int, row: list[str] | None, failure: str, present: list[int], policy: PreflightPolicy
) -> GpuLook:
    if row is None:
        why = failure or f"GPU {gpu} is not on this node (it has {_indexes(present)})"
        return GpuLook(GpuReadiness(index=gpu, ready=False, problems=(why,)), {}, False)
    util_text, memory_text, mode = row
    problems: list[str] = []
    utilization = int(util_text) if util_text.isdigit() else None
    memory = int(memory_text) if memory_text.isdigit() else None
    answers = utilization is not None and memory is not None
    if not answers:
        problems.append(f"does not answer NVML (utilisation {util_text!r}, memory {memory_text!r})")
    if mode == PROHIBITED:
        problems.append("compute mode Prohibited: no job may create a context on it")

    apps = await node.run(apps_command(gpu))
    compute = parse_pids(apps.stdout) if apps.exit_status == 0 else []
    if apps.exit_status != 0:
        problems.append(f"its compute processes cannot be read ({said(apps)})")
    held = await node.run(holders_command(gpu))
    holders = parse_pids(held.stdout) if held.exit_status == 0 else []
    if held.exit_status not in (0, NO_PROCESS):
        problems.append(f"/dev/nvidia{gpu}'s holders cannot be read ({said(held)})")

    comms: dict[int, str] = {}
    for pid in dict.fromkeys([*compute, *holders]):
        stat = await node.run(stat_command(pid)) if pid >= 2 else None
        if stat is not None and stat.exit_status == 0 and (parsed := parse_stat(stat.stdout)).state != "Z":
            comms[pid] = parsed.comm  # a zombie holds nothing any more
    # Daemons that keep the device open (persistence, DCGM, our own sampler) do not block a job.
    holders = [pid for pid in holders if pid in comms and comms[pid] not in policy.ignore_holders and pid not in compute]
    compute = [pid for pid in compute if pid in comms]  # one that exited since the query is gone
    if compute:
        problems.append(f"compute process(es) on it: {_named(compute, comms)}")
    if holders:
        problems.append(f"/dev/nvidia{gpu} held open by {_named(holders, comms)} (a leftover NVML cannot see)")
    if mode == EXCLUSIVE_PROCESS and (compute or holders):
        problems.append("compute mode Exclusive_Process: while that process lives, the next job gets "
                        "\"CUDA-capable device is busy or unavailable\"")
    if memory is not None and memory > policy.max_memory_mib:
        problems.append(f"{memory} MiB in use (max {policy.max_memory_mib})")
    readiness = GpuReadiness(
        index=gpu,
        ready=not problems,
        problems=tuple(problems),
        utilization_pct=utilization,
        memory_used_mib=memory,
        compute_mode=mode or None,
        compute_pids=tuple(compute),
        holder_pids=tuple(holders),
    )
    return GpuLook(readiness, {pid: comms[pid] for pid in [*compute, *holders]}, answers)


async def host_problems(node: Node, policy: PreflightPolicy) -> list[str]:
    """What keeps the node itself from taking a job: the runbook's "before a run" checks of disk
    and memory headroom. A figure that cannot be read is said so, and is not ready."""
    problems = []
    if policy.min_free_disk_gib:
        disks = await node.run(DISK_FREE)  # exits 1 where /var/lib/docker is missing, and still prints /
        free = {}
        for line in disks.stdout.splitlines()[1:]:
            avail, _, target = line.strip().partition(" ")
            if avail.isdigit():
                free[target.strip()] = int(avail)
        where = "/var/lib/docker" if "/var/lib/docker" in free else "/" if "/" in free else None
        if where is None:
            problems.append(f"its free disk cannot be read ({said(disks)})")
        elif free[where] < policy.min_free_disk_gib * 2**30:
            problems.append(f"{free[where] / 2**30:.1f} GiB free on {where} (min {policy.min_free_disk_gib:g} GiB): "
                            "a job's images, checkpoints and logs fail with \"No space left on device\"")
    if policy.min_available_memory_gib:
        memory = await node.run(MEMORY)
        fields = memory.stdout.split()
        if memory.exit_status != 0 or len(fields) < 2 or not fields[1].isdigit():
            problems.append(f"its available memory cannot be read ({said(memory)})")
        elif int(fields[1]) * 1024 < policy.min_available_memory_gib * 2**30:
            problems.append(f"{int(fields[1]) / 2**20:.1f} GiB of memory available (min {policy.min_available_memory_gib:g} GiB)")
    return problems


def refusal_to_clean(look: GpuLook, policy: PreflightPolicy) -> str:
    """Why a clean must leave this GPU alone ('' when it may kill its leftovers)."""
    gpu = look.readiness
    if not look.processes:
        return f"GPU {gpu.index}: nothing to clean ({'; '.join(gpu.problems)})"
    if not look.answers or gpu.compute_mode == PROHIBITED:
        return f"GPU {gpu.index}: not cleaned: a GPU that does not answer or admits no job needs a person"
    if gpu.utilization_pct is not None and gpu.utilization_pct > policy.idle_util_pct:
        return (
            f"GPU {gpu.index}: not cleaned: it is {gpu.utilization_pct}% busy (> {policy.idle_util_pct:g}%), "
            "so what holds it may be a live job"
        )
    return ""


def refusal_to_reset(look: GpuLook, policy: PreflightPolicy) -> str:
    """Why a reset must leave this GPU alone ('' when one may make it ready: it answers, admits
    jobs, nothing uses or holds it, and what keeps it from a job is memory in use with no owner,
    the state a restarted container can leave behind: runbook 003)."""
    gpu = look.readiness
    if not look.answers or gpu.compute_mode == PROHIBITED:
        return f"GPU {gpu.index}: not reset: a GPU that does not answer or admits no job needs a person"
    if look.processes:
        return f"GPU {gpu.index}: not reset: {_named(list(look.processes), look.processes)} use or hold it (clean first)"
    if len(gpu.problems) != 1 or gpu.memory_used_mib is None or gpu.memory_used_mib <= policy.max_memory_mib:
        return f"GPU {gpu.index}: not reset: a reset does not clear what is in the way ({'; '.join(gpu.problems)})"
    return ""


async def identify(node: Node, pids: list[int]) -> list[ProcessTarget]:
    """Each pid as a full identity (pid, start time, command line), read now; one that exited is left out."""
    targets = []
    for pid in pids:
        stat, cmdline = await node.run(stat_command(pid)), await node.run(cmdline_command(pid))
        if stat.exit_status != 0 or cmdline.exit_status != 0:
            continue
        parsed, command = parse_stat(stat.stdout), parse_cmdline(cmdline.stdout)
        if parsed.state == "Z" or not command:  # a zombie holds nothing; no command line: a kernel thread
            continue
        targets.append(ProcessTarget(pid=pid, start_ticks=parsed.start_ticks, command=redact(command)))
    return targets


def _named(pids: list[int], comms: dict[int, str]) -> str:
    return ", ".join(f"{pid} ({comms[pid]})" for pid in pids)


def _indexes(present: list[int]) -> str:
    return f"GPUs {', '.join(map(str, present))}" if present else "no GPU NVML can see"
