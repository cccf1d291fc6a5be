"""The policy file: the shipped default is the model's, and mistakes name the file and the line."""

from __future__ import annotations

import pytest

from gpumedic_events import IncidentKind
from gpumedic_incidents import Policy, PolicyError, load_policy
from gpumedic_incidents.policy import DEFAULT_POLICY


def test_the_shipped_file_is_the_documented_default_and_covers_every_kind():
    policy = load_policy()
    assert policy == Policy()
    for kind in IncidentKind:
        policy.of(kind)
    assert policy.kinds.zombie_job.attempts == 2 and policy.gate.max_actions_per_node == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("attempts: 2", "attempts: 0"), r"policy.yaml:{line}: kinds.zombie_job.ladder.0.attempts: Input should be greater than or equal to 1"),
        (("share: 0.3", "sharez: 0.3"), r"policy.yaml:9: fleet.sharez: Extra inputs are not permitted"),
        (("clear_below_pct: 90", "clear_below_pct: 99"), r"policy.yaml:\d+: kinds.disk_pressure: Value error, clear_below_pct \(99\) must be below open_at_pct \(95\)"),
        (("action: kill_gpu_processes, attempts: 2, verify_within_s: 60", "action: rm_rf"), r"policy.yaml:{line}: kinds.zombie_job.ladder.0.action: Input should be 'kill_gpu_processes', 'restart_unit'"),
        (("version: 1", "version: 2"), r"policy.yaml:4: version: Input should be 1"),
        (("gpumedic-node-sampler.service: {}", "sshd.service: {}"), r"policy.yaml:\d+: <file>: Value error, kinds.node_silent restarts gpumedic-node-sampler.service, which actions.restart_unit.units does not allow"),
        (("gpumedic-node-sampler.service: {}", "'rm -rf /.service': {}"), r"policy.yaml:28: actions.restart_unit.units: Value error, 'rm -rf /.service' is not a systemd service name"),
        (("endpoints: {}", "endpoints: {elect: {url: 'http://10.0.0.9:8080/admin/elect'}}"), r"policy.yaml:\d+: actions.http_admin.endpoints.elect.url: Value error, url 'http://10.0.0.9:8080/admin/elect' must be http://127.0.0.1"),
        (("endpoints: {}", "endpoints: {'elect;reboot': {url: 'http://127.0.0.1/x'}}"), r"policy.yaml:\d+: actions.http_admin.endpoints: Value error, 'elect;reboot' is not an endpoint name"),
        (("gpumedic-node-sampler.service: {}", "gpumedic-node-sampler.service: {health_url: 'http://10.0.0.1/;reboot'}"), r"policy.yaml:28: actions.restart_unit.units.gpumedic-node-sampler.service.health_url: Value error, health_url 'http://10.0.0.1/;reboot' must be"),
    ],
)
def test_a_mistake_names_the_file_the_line_and_the_field(tmp_path, change, message):
    path = tmp_path / "policy.yaml"
    text = DEFAULT_POLICY.read_text().replace(*change, 1)
    path.write_text(text)
    line = text[: text.index(change[1])].count("\n") + 1  # where the mistake is: the message must name that line
    with pytest.raises(PolicyError, match=message.replace("{line}", str(line))):
        load_policy(path)


def test_broken_yaml_or_a_missing_file_is_said_plainly(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\nkinds:\n  zombie_job: {idle_for_s: [1,\n")
    with pytest.raises(PolicyError, match=r"policy.yaml:\d+: not valid YAML"):
        load_policy(path)
    with pytest.raises(PolicyError, match="nowhere.yaml: cannot be read: No such file or directory"):
        load_policy(tmp_path / "nowhere.yaml")
    path.write_text("- just a list\n")
    with pytest.raises(PolicyError, match="a policy is a mapping"):
        load_policy(path)


def test_a_step_may_not_ask_more_often_while_its_target_is_in_use_than_an_incident_has_actions():
    import pytest
    from pydantic import ValidationError

    from gpumedic_incidents.policy import Step

    assert Step(action="gpu_reset", wait_while_in_use_s=86400, ask_again_every_s=1800).wait_while_in_use_s == 86400
    with pytest.raises(ValidationError, match="gpu_reset would ask 1440 times while its target is in use; at most 80"):
        Step(action="gpu_reset", wait_while_in_use_s=86400, ask_again_every_s=60)
