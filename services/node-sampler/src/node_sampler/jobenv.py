"""The job a GPU process is a rank of, from the environment its launcher gave it.

A training job across nodes is many processes that know they belong together only through what
the launcher put in their environment: torchrun's `TORCHELASTIC_RUN_ID`, `RANK`, `WORLD_SIZE`,
`LOCAL_WORLD_SIZE`, `GROUP_WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT` (PyTorch's "torchrun (Elastic
Launch)", environment variables); Slurm's `SLURM_JOB_ID`, `SLURM_STEP_ID`, `SLURM_PROCID`,
`SLURM_NTASKS`, `SLURM_JOB_NUM_NODES` (sbatch/srun's output environment); Open MPI's
`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_SIZE`; or a variable the operator names; and NCCL's
`NCCL_RAS_ADDR`, where the job's RAS listens (jobs sharing a node each take their own port, as
NCCL's guide advises), kept on the node for asking it. Only these are
read out of /proc/PID/environ (the rest of a job's environment holds its secrets and never leaves
this module), and a value that is not a plain id or number is dropped, never sent.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

MAX_ENVIRON_BYTES = 256 * 1024
"""An environment bigger than this is read that far (ARG_MAX is 2 MiB; a launcher's variables come early)."""

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,179}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")

RANKS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
WORLD_SIZES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LOCAL_SIZES = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
NODE_COUNTS = ("GROUP_WORLD_SIZE", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
READ = frozenset((
    *RANKS, *WORLD_SIZES, *LOCAL_SIZES, *NODE_COUNTS,
    "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT", "NCCL_RAS_ADDR",
))


@dataclass(frozen=True)
class JobEnv:
    """A rank's place in its job, as plain values (the sample's `JobTag`)."""

    id: str
    rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    nodes: int | None = None
    ras_port: int | None = None
    """Where its NCCL's RAS listens on this node's loopback (NCCL_RAS_ADDR), when the job moved it;
    only a loopback or any-address listener counts (the sampler asks nothing elsewhere). Not sent."""


def parse_environ(raw: bytes, label: str = "") -> JobEnv | None:
    """The job in a NUL-separated environment (/proc/PID/environ), or None when it names none.

    The id, first found wins: the operator's `label` variable, torchrun's run id (not its default
    "none"), Slurm's job (and step), then the rendezvous address, which names a job across nodes
    only when it is not a loopback address (every single-node job meets at 127.0.0.1:29500).
    """
    wanted = READ | {label} if label else READ
    env: dict[str, str] = {}
    for item in raw[:MAX_ENVIRON_BYTES].split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and (key := name.decode("ascii", errors="replace")) in wanted:
            env[key] = value.decode("utf-8", errors="replace").strip()
    job = _job_id(env, label)
    if job is None:
        return None
    return JobEnv(
        id=job,
        rank=_first_int(env, RANKS, 0),
        world_size=_first_int(env, WORLD_SIZES, 1),
        local_world_size=_first_int(env, LOCAL_SIZES, 1),
        nodes=_first_int(env, NODE_COUNTS, 1),
        ras_port=_ras_port(env.get("NCCL_RAS_ADDR", "")),
    )


def _ras_port(address: str) -> int | None:
    """NCCL_RAS_ADDR's port (`localhost:12345`, `127.0.0.1:12345`, `[::1]:12345`, `0.0.0.0:12345`),
    when its host is this node's loopback or every address; None otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or len(port) > 5:
        return None
    if host in ("", "0.0.0.0", "::") or _loopback(host):
        return int(port)
    return None


def _job_id(env: dict[str, str], label: str) -> str | None:
    if label and _ID.fullmatch(value := env.get(label, "")):
        return f"label:{value}"
    run = env.get("TORCHELASTIC_RUN_ID", "")
    if run != "none" and _ID.fullmatch(run):
        return f"torchelastic:{run}"
    if _ID.fullmatch(slurm := env.get("SLURM_JOB_ID", "")) and slurm.isdigit():
        step = env.get("SLURM_STEP_ID", "")
        return f"slurm:{slurm}.{step}" if step.isdigit() else f"slurm:{slurm}"
    host, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if _HOST.fullmatch(host) and port.isdigit() and 0 < int(port) < 65536 and not _loopback(host):
        return f"rendezvous:{host}:{int(port)}"
    return None


def _loopback(host: str) -> bool:
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _first_int(env: dict[str, str], names: tuple[str, ...], low: int) -> int | None:
    """The first of `names` that holds a plain decimal number in range."""
    for name in names:
        digits = env.get(name, "")
        if digits.isdigit() and len(digits) <= 7 and low <= int(digits) <= 1_000_000:
            return int(digits)
    return None
