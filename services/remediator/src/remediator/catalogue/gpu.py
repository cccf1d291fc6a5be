"""gpu_reset: `nvidia-smi --gpu-reset` on one GPU, only when nothing holds it.

A reset under a live process kills that process's work without a word, so two checks come
first, both on the node: NVML's compute processes on the GPU (`--query-compute-apps`) must be
none, and `fuser` must find no process holding the GPU's device file (a leftover that opened
/dev/nvidiaN without a CUDA context is invisible to NVML). A node without `fuser` cannot prove
the second, so the reset is refused there. Afterwards the GPU must answer a query again; its
memory, retired pages and row remaps are for the next samples to verify.
"""

from __future__ import annotations

from gpumedic_events import ActionOutcome, GpuReset
from gpumedic_incidents.policy import Actions
from remediator.catalogue.base import ExecutionResult, Means, Node, quoted, said, validate_gpu_index

NO_PROCESS = 1
"""fuser's exit status when no process uses the file."""


def apps_command(gpu_index: object) -> str:
    """NVML's compute processes on one GPU: a pid per line."""
    return f"nvidia-smi --query-compute-apps=pid --format=csv,noheader --id={quoted(validate_gpu_index(gpu_index))}"


def holders_command(gpu_index: object) -> str:
    """Processes holding the GPU's device file: pids on stdout, exit NO_PROCESS when none."""
    return f"fuser /dev/nvidia{quoted(validate_gpu_index(gpu_index))}"


def parse_pids(stdout: str) -> list[int]:
    """The pids in nvidia-smi's or fuser's answer (fuser suffixes each with its access letters)."""
    return [int(w.rstrip("cefFrm")) for w in stdout.replace(",", " ").split() if w.rstrip("cefFrm").isdigit()]


def render(operation: GpuReset, actions: Actions | None = None) -> tuple[str, ...]:
    gpu = quoted(validate_gpu_index(operation.gpu_index))
    return (
        apps_command(operation.gpu_index),
        holders_command(operation.gpu_index),
        f"nvidia-smi --gpu-reset -i {gpu}",
        f"nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits --id={gpu}",
    )


async def execute(operation: GpuReset, node: Node, means: Means) -> ExecutionResult:
    apps, holders, reset, query = render(operation)
    gpu = operation.gpu_index
    result = await node.run(apps)
    if result.exit_status != 0:
        return node.result(ActionOutcome.BLOCKED, f"refused: GPU {gpu}'s compute processes cannot be read ({said(result)})")
    pids = parse_pids(result.stdout)
    if pids:
        return node.result(ActionOutcome.BLOCKED, f"refused: GPU {gpu} runs compute process(es) {', '.join(map(str, pids))}; not reset",
                           in_use=True)
    result = await node.run(holders)
    if result.exit_status != NO_PROCESS:  # only "nobody" lets the reset go on
        held = parse_pids(result.stdout)
        if held:
            why = f"held by pid(s) {', '.join(map(str, held))}"
        else:
            why = "in use, says fuser" if result.exit_status == 0 else f"not provably free: fuser failed ({said(result)})"
        # in use: worth asking again once it is free; a fuser that fails will fail again
        return node.result(ActionOutcome.BLOCKED, f"refused: /dev/nvidia{gpu} is {why}; not reset", in_use=result.exit_status == 0)
    result = await node.run(reset)
    if result.exit_status != 0:
        return node.result(ActionOutcome.FAILED, f"nvidia-smi --gpu-reset on GPU {gpu} failed: {said(result)}")
    back, answer = await node.poll_command(query, lambda r: r.exit_status == 0 and r.stdout.strip().isdigit())
    if not back:
        return node.result(
            ActionOutcome.FAILED, f"GPU {gpu} was reset but does not answer after {node.verify_timeout_s:g}s ({said(answer)})"
        )
    return node.result(ActionOutcome.SUCCEEDED, f"GPU {gpu} reset; it answers again with {answer.stdout.strip()} MiB in use")
