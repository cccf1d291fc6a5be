"""NCCL's RAS on a simulated node: its client port, answering as NCCL's user guide describes
(Troubleshooting, RAS) for the job whose ranks run here.

Every rank's RAS thread keeps the others alive, so a query on any node of a job sees the whole
job (`RasNetwork`, the fleet's). A rank that exited, or stopped without exiting (`SimProcess.
stopped`: SIGSTOP, a process stuck in the kernel), does not answer: it is missing, unresponsive,
and considered dead once missing for a minute. Its GPU lost is not that: the RAS thread runs on
the CPU and answers. The port is held by the node's first rank: when that one is stopped, the
port accepts and never answers; with no rank, or RAS off, nothing answers. The protocol is text
lines (CLIENT PROTOCOL, SET FORMAT, TIMEOUT, [VERBOSE] STATUS); JSON from NCCL 2.28.7, text before,
listing the missing processes and ranks only where they are few (a quarter, or under half when
asked verbosely), as NCCL does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import zlib
from dataclasses import dataclass, field
from typing import Protocol

from gpumedic_sim.machine.parts import SimProcess

DEAD_AFTER_S = 60.0
"""How long RAS keeps trying to reach a process before it declares it dead."""
JSON_FROM = (2, 28, 7)
_READ_TIMEOUT_S = 30.0


def fabric_address(node_id: str) -> str:
    """The address of the node's bootstrap interface, as RAS names the node."""
    n = zlib.crc32(node_id.encode())
    return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n % 250 + 2}"


class RasNode(Protocol):
    """What NCCL's RAS reads of a node (`NodeState`'s)."""

    node_id: str
    processes: dict[int, SimProcess]

    def live_processes(self, gpu: int | None = None) -> list[SimProcess]: ...


@dataclass
class RasNetwork:
    """The RAS threads of the fleet's ranks: what one query learns about a job."""

    nodes: list[RasNode] = field(default_factory=list)
    _missing_since: dict[tuple[str, int], float] = field(default_factory=dict)

    def ranks(self, job_id: str) -> dict[int, tuple[RasNode, SimProcess]]:
        """Each rank of the job, by number: its newest process (a restarted rank's)."""
        found: dict[int, tuple[RasNode, SimProcess]] = {}
        for node in self.nodes:
            for p in list(node.processes.values()):
                if p.job is not None and p.job.id == job_id and p.job.rank is not None:
                    if (held := found.get(p.job.rank)) is None or held[1].started_at <= p.started_at:
                        found[p.job.rank] = (node, p)
        return found

    def missing_for(self, job_id: str, rank: int, missing: bool, now: float) -> float:
        """Seconds the rank has been missing (0 when it answers)."""
        key = (job_id, rank)
        if not missing:
            self._missing_since.pop(key, None)
            return 0.0
        return now - self._missing_since.setdefault(key, now)


class RasEndpoint:
    def __init__(self, node: RasNode) -> None:
        self.node = node
        self.network = RasNetwork([node])
        """Every node's, once it is part of a fleet."""
        self.nccl_version: str | None = None
        """The NCCL its jobs across nodes link (set when one starts); None: RAS off or NCCL older than 2.24."""
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    async def start(self, host: str) -> None:
        self._server = await asyncio.start_server(self._handle, host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            self._server = None

    def _holder(self) -> SimProcess | None:
        ranks = [p for p in self.node.live_processes() if p.job is not None]
        return min(ranks, key=lambda p: p.started_at) if ranks and self.nccl_version else None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            holder = self._holder()
            if holder is None:
                return  # nothing of NCCL listens: the connection ends at once
            output = "text"
            while line := (await asyncio.wait_for(reader.readline(), _READ_TIMEOUT_S)).decode(errors="replace").strip():
                if holder.stopped:
                    continue  # the process holding the port is stopped: its RAS thread reads nothing
                command = line.lower()
                if command.startswith("client protocol "):
                    writer.write(b"SERVER PROTOCOL 2\n")
                elif command.startswith("timeout ") and command[8:].isdigit():
                    writer.write(b"OK\n")
                elif command == "set format json" and _version(self.nccl_version) >= JSON_FROM:
                    output = "json"
                    writer.write(b"OK\n")
                elif command == "set format text" and _version(self.nccl_version) >= JSON_FROM:
                    writer.write(b"OK\n")
                elif command in ("status", "verbose status"):
                    status = self.status(holder, output, verbose=command.startswith("verbose"))
                    writer.write(status.encode())
                    await writer.drain()
                    return
                else:
                    writer.write(f"ERROR: Unknown command {line}\n".encode())
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._handlers.discard(task)

    def status(self, holder: SimProcess, output: str, *, verbose: bool) -> str:
        assert holder.job is not None
        job = holder.job
        now = time.monotonic()
        ranks = self.network.ranks(job.id)
        world = job.world_size or len(ranks)
        rows = []
        for rank in range(world):
            node, p = ranks.get(rank, (None, None))
            missing = p is None or not p.alive or p.stopped
            away = self.network.missing_for(job.id, rank, missing, now)
            rows.append((rank, node, p, missing, away >= DEAD_AFTER_S))
        comm_hash = int(hashlib.blake2s(job.id.encode(), digest_size=8).hexdigest(), 16)
        if output == "json":
            return _json(self.nccl_version or "", comm_hash, world, rows)
        return _text(self.nccl_version or "", comm_hash, world, rows, verbose)


def _version(text: str | None) -> tuple[int, ...]:
    parts = (text or "0").split("+")[0].split(".")
    return tuple(int(p) for p in parts if p.isdigit())


def _where(node: RasNode | None, p: SimProcess | None) -> dict:
    return {"host": fabric_address(node.node_id) if node else "0.0.0.0", "pid": p.pid if p else 0,
            "cuda_dev": p.gpu if p and p.gpu is not None else -1, "nvml_dev": p.gpu if p and p.gpu is not None else -1}


def _json(version: str, comm_hash: int, world: int, rows: list) -> str:
    present = [{"rank": rank, **_where(node, p), "status": {"init_state": 0, "async_error": 0, "finalize_called": False,
                                                           "destroy_flag": False, "abort_flag": False},
                "collective_counts": {"Broadcast": 2, "Reduce": 0, "AllGather": 40, "ReduceScatter": 0, "AllReduce": 9000}}
               for rank, node, p, missing, _ in rows if not missing]
    absent = [{"rank": rank, **_where(node, p), "status": {"unresponsive": True, "considered_dead": dead}}
              for rank, node, p, missing, dead in rows if missing]
    return json.dumps({
        "nccl_version": version, "cuda_runtime_version": 12080, "cuda_driver_version": 12080,
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), "communicators_count": 1,
        "communicators": [{"hash": f"0x{comm_hash:x}", "secondary_hash": f"0x{comm_hash ^ 0x5A5A:x}:0x{comm_hash >> 3:x}",
                           "size": world, "ranks_count": len(present), "missing_ranks_count": len(absent),
                           "ranks": present, "missing_ranks": absent}],
        "ras": {"collection_time_sec": 5.0 if absent else 0.01, "timeouts_count": len(absent)},
    }, indent=2) + "\n"


def _text(version: str, comm_hash: int, world: int, rows: list, verbose: bool) -> str:
    nodes = {node.node_id for _, node, *_ in rows if node is not None}
    per_node = max(1, world // max(1, len(nodes)))
    absent = [(rank, node, p, dead) for rank, node, p, missing, dead in rows if missing]
    listed = (len(absent) * 2 < world) if verbose else (len(absent) * 4 <= world and len(absent) <= 10)
    lines = [f"NCCL version {version}+cuda12.8 compiled with CUDA 12.8", "CUDA runtime version 12080, driver version 12080", "",
             "Job summary", "===========", "",
             "  Nodes  Processes         GPUs  Processes     GPUs",
             "(total)   per node  per process    (total)  (total)",
             f"{len(nodes):7d}  {per_node:9d}  {1:11d}  {world:9d}  {world:7d}", "",
             f"Gathering data about the NCCL communicators (timeout 5s)... ({5.0 if absent else 0.01:.2f}s)", "=============", "",
             "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors",
             "    #  in group  per comm  per node  per comm  in group",
             f"{0:5d}  {1:8d}  {len(nodes):8d}  {per_node:8d}  {world:8d}  {world:8d}  {'RUNNING':>8s}  "
             f"{'INCOMPLETE' if absent else 'OK':>6s}", "", "Errors", "======", ""]
    unresponsive = [a for a in absent if not a[3] and a[2] is not None]
    dead = [a for a in absent if a[3] and a[2] is not None]
    for title, group, says in (("INCOMPLETE", unresponsive, "Missing communicator data from {n} job process{es}"),
                               ("DEAD", dead, "{n} job process{es} considered dead (unreachable via the RAS network)")):
        if group:
            lines += [title, "  " + says.format(n=len(group), es="es" if len(group) > 1 else "")]
            if listed:
                lines += [f"  Process {p.pid} on node {fabric_address(node.node_id)} managing GPU {p.gpu}" for _, node, p, _ in group]
            lines.append("")
    if absent:
        lines += [f"#0-0 ({comm_hash:016x}) INCOMPLETE", f"  Missing communicator data from {len(absent)} rank{'s' if len(absent) > 1 else ''}"]
        if listed:
            lines.append(f"  The missing rank{'s' if len(absent) > 1 else ''}: {', '.join(str(rank) for rank, *_ in absent)}")
        lines.append("")
    lines += ["Warnings", "========", ""]
    return "\n".join(lines) + "\n"
