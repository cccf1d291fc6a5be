"""Settings from GPUMEDIC_SAMPLER_* and the hostname-derived node id."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpumedic_events.base import default_node_id
from node_sampler.settings import Settings


def test_defaults(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "GPU_Node.07.Example.com")
    s = Settings()
    assert s.node_id == "gpu_node-07-example-com"
    assert (s.interval_s, s.proc_root, s.status_url, s.status_jobs_path) == (5.0, Path("/proc"), None, "selfplay_jobs")
    assert (s.job_process_pattern, s.watch_paths, s.trace_to_bus) == (None, [], False)
    assert s.container_log_lines == 50  # what a post-mortem reads (runbook 004)


def test_from_environment(monkeypatch):
    monkeypatch.setenv("GPUMEDIC_SAMPLER_NODE_ID", "gpu-node-07")
    monkeypatch.setenv("GPUMEDIC_SAMPLER_INTERVAL_S", "2.5")
    monkeypatch.setenv("GPUMEDIC_SAMPLER_STATUS_URL", "http://127.0.0.1:8770/status")
    monkeypatch.setenv("GPUMEDIC_SAMPLER_WATCH_PATHS", '["/data/a", "/data/b"]')
    monkeypatch.setenv("GPUMEDIC_SAMPLER_JOB_PROCESS_PATTERN", r"selfplay\b")
    monkeypatch.setenv("GPUMEDIC_NATS_URL", "nats://10.0.0.1:4222")
    monkeypatch.setenv("GPUMEDIC_SAMPLER_CONTAINER_LOG_LINES", "12")
    s = Settings()
    assert s.container_log_lines == 12
    assert (s.node_id, s.interval_s, s.status_url) == ("gpu-node-07", 2.5, "http://127.0.0.1:8770/status")
    assert s.watch_paths == [Path("/data/a"), Path("/data/b")]
    assert s.nats.servers == ["nats://10.0.0.1:4222"]


@pytest.mark.parametrize(("name", "value"), [("NODE_ID", "bad.node"), ("INTERVAL_S", "0"), ("JOB_PROCESS_PATTERN", "("),
                                             ("CONTAINER_LOG_LINES", "51"), ("CONTAINER_LOG_LINES", "-1")])
def test_invalid_values_fail_fast(monkeypatch, name, value):
    monkeypatch.setenv(f"GPUMEDIC_SAMPLER_{name}", value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize(("host", "expected"), [("--", "node"), ("Ümlaut-Box", "mlaut-box"), ("a" * 80, "a" * 63)])
def test_node_id_from_odd_hostnames(host, expected):
    assert default_node_id(host) == expected


def test_a_job_count_path_that_is_not_jmespath_is_refused_at_start():
    with pytest.raises(ValidationError, match="'p2p.jobs.0.count' is not a JMESPath expression"):
        Settings(status_jobs_path="p2p.jobs.0.count")
