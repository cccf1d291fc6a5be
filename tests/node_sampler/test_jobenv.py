"""The job a GPU process is a rank of, from the environment its launcher gave it.

The environments are written from the launchers' documents: torchrun's worker variables
(PyTorch, "torchrun (Elastic Launch)": LOCAL_RANK, RANK, GROUP_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE,
GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID), Slurm's srun output
environment (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NUM_NODES) and
Open MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_SIZE).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from gpumedic_events import JobTag

from node_sampler.jobenv import JobEnv, parse_environ
from node_sampler.procs import ProcessInfo, ProcFsTable
from node_sampler.readings import NvmlReading, RawGpu, RawProcess, assemble_sample

SECRETS = {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz123456", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}


def environ(**variables: str) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in {"PATH": "/usr/bin", **SECRETS, **variables}.items())


TORCHRUN = dict(
    LOCAL_RANK="3", RANK="11", GROUP_RANK="1", ROLE_RANK="11", LOCAL_WORLD_SIZE="8", WORLD_SIZE="16", GROUP_WORLD_SIZE="2",
    ROLE_WORLD_SIZE="16", MASTER_ADDR="10.0.4.17", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="llama-ft-0412",
    TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="3",
)


def test_a_torchrun_rank_names_its_run_and_place():
    assert parse_environ(environ(**TORCHRUN)) == JobEnv(
        id="torchelastic:llama-ft-0412", rank=11, world_size=16, local_world_size=8, nodes=2
    )


def test_torchruns_default_run_id_is_no_id_and_the_rendezvous_names_the_job():
    job = parse_environ(environ(**{**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}))
    assert job is not None and job.id == "rendezvous:10.0.4.17:29500"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.1.1"])
def test_a_loopback_rendezvous_names_no_job_across_nodes(host):
    # every single-node job meets at 127.0.0.1:29500: the address would make them one job
    assert parse_environ(environ(MASTER_ADDR=host, MASTER_PORT="29500", RANK="0", WORLD_SIZE="8")) is None


def test_a_slurm_step_and_an_mpi_rank():
    slurm = parse_environ(environ(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="9", SLURM_NTASKS="32",
                                  SLURM_JOB_NUM_NODES="4", SLURM_NTASKS_PER_NODE="8"))
    assert slurm == JobEnv(id="slurm:4242.0", rank=9, world_size=32, local_world_size=8, nodes=4)
    mpi = parse_environ(environ(OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_SIZE="16", OMPI_COMM_WORLD_LOCAL_SIZE="4",
                                MASTER_ADDR="gpu-a.fabric", MASTER_PORT="6000"))
    assert mpi == JobEnv(id="rendezvous:gpu-a.fabric:6000", rank=5, world_size=16, local_world_size=4)
    assert JobTag(**vars(mpi)).spans_nodes


def test_the_operators_label_comes_first():
    job = parse_environ(environ(**TORCHRUN, JOB_ID="exp-77/run-3"), label="JOB_ID")
    assert job is not None and job.id == "label:exp-77/run-3"
    assert parse_environ(environ(JOB_ID="exp-77"), label="") is None  # not named: not read


@pytest.mark.parametrize(
    "variables",
    [
        {"TORCHELASTIC_RUN_ID": "run; rm -rf /"},
        {"TORCHELASTIC_RUN_ID": "x" * 500},
        {"TORCHELASTIC_RUN_ID": "\x1b[31mred"},
        {"SLURM_JOB_ID": "42abc"},
        {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "99999"},
        {"MASTER_ADDR": "$(reboot)", "MASTER_PORT": "29500"},
        {},
    ],
)
def test_a_value_that_is_no_plain_id_names_no_job(variables):
    assert parse_environ(environ(**variables)) is None


def test_numbers_that_are_not_plain_are_left_out():
    job = parse_environ(environ(TORCHELASTIC_RUN_ID="r1", RANK="-1", WORLD_SIZE="1e9", LOCAL_WORLD_SIZE="0", GROUP_WORLD_SIZE="abc"))
    assert job == JobEnv(id="torchelastic:r1")


def test_a_huge_or_broken_environment_costs_nothing_but_what_it_holds():
    assert parse_environ(b"\xff\xfe=\x00" * 1000 + environ(TORCHELASTIC_RUN_ID="r2")) == JobEnv(id="torchelastic:r2")
    assert parse_environ(b"A=" + b"x" * 2_000_000) is None


def test_a_real_process_launched_as_a_rank_is_read_from_the_real_proc():
    env = {**os.environ, **TORCHRUN, **SECRETS, "NCCL_RAS_ADDR": "localhost:12345"}
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"  # exec'd: /proc shows its own environment
        info = ProcFsTable().describe(child.pid)
    finally:
        child.kill()
        child.wait()
    assert info is not None and info.job == JobEnv(id="torchelastic:llama-ft-0412", rank=11, world_size=16, local_world_size=8, nodes=2,
                                                   ras_port=12345)


def test_the_sample_carries_the_rank_and_no_other_variable():
    job = parse_environ(environ(**TORCHRUN))
    raw = RawGpu(0, "GPU-1", "H100", 0, 0, 1, 2, (RawProcess(41230, 1024 * 1024),))
    sample = assemble_sample(
        node_id="gpu-node-07", interval_s=5.0, occurred_at=datetime(2026, 11, 28, tzinfo=UTC), nvml=NvmlReading((raw,)),
        processes={41230: ProcessInfo(41230, 88, "python train.py", job=job)}, jobs=(), errors=(),
    )
    (process,) = sample.gpus[0].processes
    assert process.job == JobTag(id="torchelastic:llama-ft-0412", rank=11, world_size=16, local_world_size=8, nodes=2)
    body = sample.model_dump_json()
    assert not any(secret in body for secret in SECRETS.values()) and "MASTER_ADDR" not in body


@pytest.mark.parametrize("address, port", [
    ("localhost:12345", 12345), ("127.0.0.1:12346", 12346), ("[::1]:28029", 28029), ("0.0.0.0:28030", 28030), (":28031", 28031),
    ("10.0.4.17:28028", None),  # another interface: the sampler asks only its own loopback
    ("evil.example:28028", None), ("localhost:0", None), ("localhost:99999", None), ("localhost", None), ("localhost:12a", None),
])
def test_the_jobs_own_ras_address_is_kept_only_when_it_is_this_nodes_loopback(address, port):
    job = parse_environ(environ(**TORCHRUN, NCCL_RAS_ADDR=address))
    assert job is not None and job.ras_port == port


def test_the_ras_port_stays_on_the_node():
    job = parse_environ(environ(**TORCHRUN, NCCL_RAS_ADDR="localhost:12345"))
    raw = RawGpu(0, "GPU-1", "H100", 0, 0, 1, 2, (RawProcess(41230, 1024 * 1024),))
    sample = assemble_sample(
        node_id="gpu-node-07", interval_s=5.0, occurred_at=datetime(2026, 11, 28, tzinfo=UTC), nvml=NvmlReading((raw,)),
        processes={41230: ProcessInfo(41230, 88, "python train.py", job=job)}, jobs=(), errors=(),
    )
    assert "12345" not in sample.model_dump_json() and sample.gpus[0].processes[0].job.rank == 11
