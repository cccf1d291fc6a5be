"""kill_pattern: runbook 000's `pkill -f 'python.*selfplay'` through the closed catalogue, run
against the simulated node's shell (the same interpreter its SSH server uses): only an
allow-listed pattern, by name; never while a GPU works; each match checked right before its
signal; a process that ignores SIGTERM gets SIGKILL; processes started again are said."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpumedic_events import ActionOutcome, KillPattern
from gpumedic_incidents.policy import Actions, FleetPolicy, Kinds, PatternKillPolicy, Policy, ProcessPattern, Step, ZombiePolicy
from gpumedic_sim.machine.ssh import interpret
from gpumedic_sim.machine.node import ScriptedNode
from remediator import catalogue
from remediator.catalogue import InvalidParameter, render

ACTIONS = Actions(kill_pattern=PatternKillPolicy(grace_s=2, patterns={"selfplay": ProcessPattern(regex="python.*selfplay", max_processes=4)}))
LAUNCHER = ("python", "scripts/run_selfplay.py", "--workers", "2")


def stuck_node(workers: int = 2) -> ScriptedNode:
    """A launcher on the host and its workers on GPUs 0..workers-1, all hung (GPUs at 0 %), and a
    process of someone else's that must stay."""
    node = ScriptedNode("gpu-node-07", 4, seed=1)
    node._spawn(LAUNCHER, None, 0, is_job=False, producing=False)
    for gpu in range(workers):
        node.inject_zombie(gpu)
    node._spawn(("python", "eval.py", "--checkpoint", "latest.pt"), None, 0, is_job=False, producing=False)
    return node


async def run(node: ScriptedNode, operation: KillPattern, actions: Actions = ACTIONS):
    async def shell(command: str, **_) -> catalogue.CommandResult:
        r = interpret(node, command)
        return catalogue.CommandResult(r.exit_status, r.stdout, r.stderr)

    async def no_sleep(_: float) -> None:
        return None

    ticks = iter(range(100_000))
    return await catalogue.execute(operation, shell, actions=actions, verify_timeout_s=10, sleep=no_sleep, clock=lambda: next(ticks) * 0.5)


def op(**fields) -> KillPattern:
    return KillPattern(**{"pattern": "selfplay", "grace_s": 2, "max_gpu_utilization_pct": 4} | fields)


def alive(node: ScriptedNode) -> list[str]:
    return sorted(" ".join(p.argv) for p in node.live_processes())


async def test_every_process_of_the_pattern_ends_and_nothing_else():
    node = stuck_node()
    result = await run(node, op())
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert alive(node) == ["python eval.py --checkpoint latest.pt"]
    assert "3 process(es) matched selfplay (python.*selfplay); sent TERM to" in result.detail
    assert "pgrep -f -a -- 'python.*selfplay'" in result.steps
    assert sum(step.startswith("kill -s TERM ") for step in result.steps) == 3


async def test_a_working_gpu_refuses_it_and_nothing_is_signalled():
    node = stuck_node()
    node.start_job(3)  # GPU 3 computes: the pattern would end its work too
    before = alive(node)
    result = await run(node, op())
    assert result.outcome is ActionOutcome.BLOCKED and "GPU 3 at" in result.detail and "nothing was signalled" in result.detail
    assert alive(node) == before and not [s for s in result.steps if s.startswith("kill")]


async def test_a_pattern_wider_than_its_limit_is_refused():
    node = stuck_node(workers=4)  # the launcher and 4 workers: 5 > max_processes 4
    result = await run(node, op())
    assert result.outcome is ActionOutcome.BLOCKED and "5 processes match selfplay, more than its max_processes (4)" in result.detail
    assert len(alive(node)) == 6


async def test_nothing_matching_is_nothing_to_end():
    node = ScriptedNode("gpu-node-07", 2, seed=1)
    result = await run(node, op())
    assert result.outcome is ActionOutcome.SUCCEEDED and "nothing to end" in result.detail


async def test_a_process_that_ignores_sigterm_gets_sigkill_after_the_grace():
    node = stuck_node(workers=1)
    node.inject_zombie(0, ignore_term=True)
    result = await run(node, op())
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert "sent KILL after 2s to" in result.detail and alive(node) == ["python eval.py --checkpoint latest.pt"]


async def test_processes_started_again_fail_the_action_and_say_so():
    node = stuck_node(workers=1)
    ended = node.kill

    def kill_and_respawn(pid: int, signal: str = "KILL") -> bool:  # a unit that restarts the launcher the moment it ends
        done = ended(pid, signal)
        if done and any(p.argv == LAUNCHER for p in node.processes.values() if p.pid == pid):
            node._spawn(LAUNCHER, None, 0, is_job=False, producing=False)
        return done

    node.kill = kill_and_respawn
    result = await run(node, op())
    assert result.outcome is ActionOutcome.FAILED and "started again:" in result.detail and "a unit or a scheduler" in result.detail


def test_only_a_pattern_of_the_policy_by_name_and_a_plain_one():
    with pytest.raises(InvalidParameter, match="pattern 'other' is not in actions.kill_pattern.patterns"):
        render(op(pattern="other"), ACTIONS)
    with pytest.raises(ValidationError):
        op(pattern="python.*selfplay")  # a request names a pattern; it never carries one
    for regex, why in (("python'; rm -rf /", "nothing else"), ("a\\\\b", "nothing else"), (".*", "3-200"), ("x*|y*", "matches an empty")):
        with pytest.raises(ValidationError, match=why):
            ProcessPattern(regex=regex)
    with pytest.raises(ValidationError, match="which actions.kill_pattern.patterns does not list"):
        Policy(kinds=Kinds(zombie_job=ZombiePolicy(kill_pattern="selfplay")))
    with pytest.raises(ValidationError, match="names no pattern"):
        Policy(kinds=Kinds(zombie_job=ZombiePolicy(ladder=(Step(action="kill_pattern"),))))
    Policy(actions=ACTIONS, fleet=FleetPolicy(), kinds=Kinds(zombie_job=ZombiePolicy(kill_pattern="selfplay")))
    assert render(op(), ACTIONS)[1] == "pgrep -f -a -- 'python.*selfplay'"
