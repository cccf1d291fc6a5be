"""Assembling a valid NodeSampled from raw readings, whatever the readings say."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from node_sampler.readings import (
    MAX_ERRORS,
    JobsReading,
    NvmlReading,
    RawGpu,
    RawProcess,
    assemble_sample,
    merge_jobs,
    next_tick,
)
from node_sampler.procs import ProcessInfo

AT = datetime(2026, 11, 22, 10, 15, tzinfo=UTC)
MIB = 1024 * 1024


def _assemble(nvml: NvmlReading, processes=None, jobs=(), errors=()):
    return assemble_sample(
        node_id="gpu-node-07", interval_s=5.0, occurred_at=AT, nvml=nvml, processes=processes or {}, jobs=jobs, errors=errors
    )


def test_a_full_reading():
    raw = RawGpu(0, "GPU-1", "H100", 90, 40, 20480 * MIB, 81559 * MIB, (RawProcess(41230, 20480 * MIB),))
    sample = _assemble(NvmlReading((raw,)), {41230: ProcessInfo(41230, 88, "python train.py")}, [JobsReading(running=1)])
    assert sample.occurred_at == AT
    (gpu,) = sample.gpus
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (20480, 81559)
    assert gpu.processes[0].model_dump(include={"pid", "start_ticks", "command", "used_memory_mib"}) == {
        "pid": 41230,
        "start_ticks": 88,
        "command": "python train.py",
        "used_memory_mib": 20480,
    }
    assert sample.jobs.running == 1 and sample.jobs.output_growing is None


def test_out_of_range_values_become_notes_not_exceptions():
    raw = RawGpu(
        3,
        "G" * 200,
        None,
        utilization_gpu_pct=101,
        utilization_memory_pct=-1,
        memory_used_bytes=2**64 - 1,  # NVML_VALUE_NOT_AVAILABLE
        processes=(RawProcess(0), RawProcess(5_000_000), RawProcess(7)),
    )
    sample = _assemble(NvmlReading((raw,)), {7: ProcessInfo(7, 1, "x" * 5000)})
    (gpu,) = sample.gpus
    assert gpu.utilization_gpu_pct is None and gpu.utilization_memory_pct is None
    assert gpu.memory_used_mib is None
    assert len(gpu.uuid) == 96 and gpu.name == ""
    assert [p.pid for p in gpu.processes] == [7]
    assert len(gpu.processes[0].command) == 4096
    assert sample.errors == (
        "gpu 3: pid 0 out of range, left out",
        "gpu 3: pid 5000000 out of range, left out",
        "gpu 3 utilization: 101 is not a percentage",
        "gpu 3 memory utilization: -1 is not a percentage",
    )


def test_errors_are_capped():
    sample = _assemble(NvmlReading(errors=tuple(f"e{i}" for i in range(100))), errors=["x" * 1000])
    assert len(sample.errors) == MAX_ERRORS
    assert sample.errors[-1] == f"and {101 - (MAX_ERRORS - 1)} more"


def test_too_many_gpus_and_processes_are_cut_with_a_note():
    procs = tuple(RawProcess(100 + i) for i in range(300))
    sample = _assemble(NvmlReading(tuple(RawGpu(i % 64, processes=procs if i == 0 else ()) for i in range(70))))
    assert len(sample.gpus) == 64
    assert len(sample.gpus[0].processes) == 256
    assert "gpu 0: 44 processes left out" in sample.errors
    assert "6 GPUs beyond the first 64 left out" in sample.errors


def test_merge_jobs_first_measurement_wins():
    obs = merge_jobs([JobsReading(), JobsReading(running=0), JobsReading(running=5, output_growing=True)])
    assert (obs.running, obs.output_growing) == (0, True)
    assert merge_jobs([]).running is None


@pytest.mark.parametrize(
    ("now", "last", "expected"),
    [
        (1000.0, 0, 1),  # right after start
        (1004.9, 0, 1),
        (1005.0, 1, 2),  # tick 1 ran on time
        (1006.0, 1, 2),
        (1017.5, 1, 4),  # ran late: ticks 2 and 3 are past, skip to 4
        (999.0, 3, 4),  # a clock that did not move never repeats a tick
    ],
)
def test_next_tick(now, last, expected):
    assert next_tick(1000.0, now, 5.0, last) == expected


def test_immediate_events_carry_node_text_cleaned_and_capped():
    from node_sampler.immediate import ContainerExitReading, OomKillReading, container_event, oom_event

    hostile = "\x1b[31mred\x1b[0m\x00 tab\there\x07" + "x" * 2000
    exit_ = container_event("n1", ContainerExitReading("c1", 139, last_log_lines=(hostile,)), AT)
    oom = oom_event("n1", OomKillReading(pid=7, kernel_lines=(hostile,)), AT)
    for line in (exit_.last_log_lines[0], oom.kernel_lines[0]):
        assert line.startswith("red tab\there") and "\x1b" not in line and "\x00" not in line and len(line) == 1024
    assert exit_.signal == "SIGSEGV"
    assert oom_event("n1", OomKillReading(pid=0), AT) is None  # no process has pid 0
    assert container_event("n1", ContainerExitReading("", 1), AT) is None
