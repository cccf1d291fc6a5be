"""The closed catalogue: command forms, validation and quoting, stat parsing, the kill sequence."""

from __future__ import annotations

import shlex

import pytest
from pydantic import ValidationError

from gpumedic_events import ActionOutcome, KillGpuProcesses, ProcessTarget
from remediator import catalogue
from remediator.catalogue import CommandResult, InvalidParameter, kill, render
from remediator.catalogue.kill import parse_cmdline, parse_stat

# A real stat line (Linux 6.x) with a comm that contains spaces and parentheses.
_TAIL = "S 1 4242 4242 0 -1 4194560 1219 0 0 0 12 3 0 0 20 0 1 0 {start} 9396224 217 18446744073709551615"


def _stat(pid: int, start: int, comm: str = "python", state: str = "S") -> str:
    return f"{pid} ({comm}) {_TAIL.format(start=start).replace('S', state, 1)}\n"


def _op(*targets: ProcessTarget, signal: str = "KILL", busy_above: int = 5) -> KillGpuProcesses:
    return KillGpuProcesses(gpu_index=0, targets=targets, signal=signal, max_gpu_utilization_pct=busy_above)


def _t(pid: int, start: int = 500, command: str = "x") -> ProcessTarget:
    """A fully identified target."""
    return ProcessTarget(pid=pid, start_ticks=start, command=command)


GPU_QUERY = "nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits --id=0"
APPS_QUERY = "nvidia-smi --query-compute-apps=pid --format=csv,noheader --id=0"
DEVICE_QUERY = "fuser /dev/nvidia0"
HOLDERS = (APPS_QUERY, DEVICE_QUERY)
"""What a kill reads first after the GPU's state: which pids hold the GPU."""


# --- command forms and quoting ---------------------------------------------------------------


def test_command_forms_are_exact():
    assert kill.stat_command(41230) == "cat /proc/41230/stat"
    assert kill.cmdline_command(41230) == "cat /proc/41230/cmdline"
    assert kill.kill_command("KILL", 41230) == "kill -s KILL 41230"
    assert kill.kill_command("TERM", 2) == "kill -s TERM 2"
    assert kill.gpu_utilization_command(7) == "nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits --id=7"


def test_render_checks_the_gpu_then_each_targets_identity_then_kills():
    op = _op(_t(41230, 5, "python train.py"), _t(77, 9, "python eval.py"), signal="TERM")
    assert render(op) == (
        GPU_QUERY,
        *HOLDERS,
        "cat /proc/41230/stat",
        "cat /proc/41230/cmdline",
        "kill -s TERM 41230",
        "cat /proc/77/stat",
        "cat /proc/77/cmdline",
        "kill -s TERM 77",
    )


def test_rendered_commands_are_plain_words():
    for command in render(_op(_t(4_194_304))):
        words = shlex.split(command)
        assert " ".join(shlex.quote(w) for w in words) == command
        assert not any(ch in command for ch in ";|&$`<>(){}\\'\"\n")


def test_render_refuses_a_pid_listed_twice():
    with pytest.raises(InvalidParameter, match="pid 99 is listed twice"):
        render(_op(_t(99), _t(99)))


@pytest.mark.parametrize(
    ("target", "missing"),
    [(ProcessTarget(pid=99, command="python train.py"), "start time"), (ProcessTarget(pid=99, start_ticks=5), "command line")],
)
def test_a_target_without_its_full_identity_is_refused(target, missing):
    with pytest.raises(InvalidParameter, match=f"pid 99 comes without its {missing}: a process is identified by pid, start time and command line"):
        render(_op(target))


def test_a_kill_that_does_not_say_when_it_is_safe_is_refused():
    op = KillGpuProcesses(gpu_index=0, targets=(_t(99),))
    with pytest.raises(InvalidParameter, match=r"in which GPU state the kill is safe \(max_gpu_utilization_pct\)"):
        render(op)


@pytest.mark.parametrize("gpu", ["0; reboot", -1, 64, True, 1.0, "../0"])
def test_catalogue_refuses_bad_gpu_indexes(gpu):
    with pytest.raises(InvalidParameter, match="GPU index .* is not an integer in 0..63"):
        kill.gpu_utilization_command(gpu)


# --- hostile inputs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pid", "message"),
    [
        ("1; rm -rf /", "pid must be an integer, not str"),
        ("123", "pid must be an integer, not str"),
        (12.0, "pid must be an integer, not float"),
        (True, "pid must be an integer, not bool"),
        (None, "pid must be an integer, not NoneType"),
        (-5, r"pid -5 is out of range 2\.\.4194304"),
        (0, "pid 0 is out of range"),
        (1, r"pid 1 is out of range 2\.\.4194304 \(pid 1 is never a target\)"),
        (4_194_305, "pid 4194305 is out of range"),
    ],
)
def test_catalogue_refuses_bad_pids(pid, message):
    with pytest.raises(InvalidParameter, match=message):
        kill.validate_pid(pid)
    with pytest.raises(InvalidParameter):
        kill.kill_command("KILL", pid)


@pytest.mark.parametrize("signal", ["HUP", "kill", "9", "KILL; reboot", "", None, 9])
def test_catalogue_refuses_unknown_signals(signal):
    with pytest.raises(InvalidParameter, match="is not allowed \\(allowed: KILL, TERM\\)"):
        kill.validate_signal(signal)


@pytest.mark.parametrize("pid", ["1; rm -rf /", -1, 1, 0, 4_194_305])
def test_event_validation_refuses_bad_pids_first(pid):
    with pytest.raises(ValidationError, match="pid"):
        ProcessTarget(pid=pid)


def test_event_validation_refuses_unknown_signal():
    with pytest.raises(ValidationError, match="signal"):
        KillGpuProcesses(gpu_index=0, targets=(ProcessTarget(pid=5),), signal="HUP")


def test_catalogue_refuses_what_skipped_event_validation():
    # Defence in depth: even an operation built without validation cannot render shell syntax.
    hostile = KillGpuProcesses.model_construct(
        gpu_index=0,
        targets=(ProcessTarget.model_construct(pid="1; rm -rf /", start_ticks=1, command="x"),),
        signal="KILL",
        max_gpu_utilization_pct=5,
    )
    with pytest.raises(InvalidParameter, match="pid must be an integer"):
        render(hostile)
    bad_signal = KillGpuProcesses.model_construct(gpu_index=0, targets=(_t(5),), signal="KILL $(reboot)", max_gpu_utilization_pct=5)
    with pytest.raises(InvalidParameter, match="not allowed"):
        render(bad_signal)
    bad_gpu = KillGpuProcesses.model_construct(gpu_index="0 $(reboot)", targets=(_t(5),), signal="KILL", max_gpu_utilization_pct=5)
    with pytest.raises(InvalidParameter, match="GPU index"):
        render(bad_gpu)


# --- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "comm",
    ["python", "my worker", "evil) S 1 2 3", "((x))", ") 99 (", "tab\tand space", ""],
)
def test_parse_stat_survives_any_comm(comm):
    stat = parse_stat(_stat(4242, 8812345, comm=comm))
    assert stat.pid == 4242
    assert stat.comm == comm
    assert stat.state == "S"
    assert stat.start_ticks == 8812345


def test_parse_stat_reads_the_zombie_state():
    assert parse_stat(_stat(7, 100, state="Z")).state == "Z"


@pytest.mark.parametrize("text", ["", "garbage", "12 (x) S 1 2", "12 (x S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"])
def test_parse_stat_refuses_what_is_not_a_stat_line(text):
    with pytest.raises(ValueError, match="not a /proc/PID/stat line"):
        parse_stat(text)


def test_parse_cmdline_joins_nul_separated_args():
    assert parse_cmdline("python\0train.py\0--epochs\x0090\0") == "python train.py --epochs 90"
    assert parse_cmdline("") == ""


# --- the kill sequence against a scripted node ------------------------------------------------


class _Node:
    """A scripted node: answers the catalogue's commands from a table of processes."""

    def __init__(
        self, processes: dict[int, dict], *, dies_after_polls: int = 0, kill_fails: str = "", gpu: CommandResult | None = None
    ) -> None:
        self.processes = processes
        self.gpu = gpu or CommandResult(0, "0\n", "")
        self.commands: list[str] = []
        self._dies_after_polls = dies_after_polls
        self._polls: dict[int, int] = {}
        self._kill_fails = kill_fails

    async def run(self, command: str) -> CommandResult:
        self.commands.append(command)
        words = command.split()
        if command == GPU_QUERY:
            return self.gpu
        if command == APPS_QUERY:  # every process of the table holds the GPU, unless it runs "elsewhere"
            return CommandResult(0, "".join(f"{pid}\n" for pid, p in self.processes.items() if not p.get("elsewhere")), "")
        if command == DEVICE_QUERY:
            return CommandResult(1, "", "")  # fuser: nobody else holds /dev/nvidia0
        if words[0] == "cat":
            pid = int(words[1].split("/")[2])
            proc = self.processes.get(pid)
            if proc is None:
                return CommandResult(1, "", f"cat: /proc/{pid}/stat: No such file or directory\n")
            if words[1].endswith("/cmdline"):
                return CommandResult(0, "\0".join(proc["cmd"].split()) + "\0", "")
            if proc.get("signalled"):
                self._polls[pid] = self._polls.get(pid, 0) + 1
                if self._polls[pid] > self._dies_after_polls:
                    if proc.get("zombie"):
                        return CommandResult(0, _stat(pid, proc["start"], state="Z"), "")
                    del self.processes[pid]
                    return CommandResult(1, "", "No such file or directory\n")
            return CommandResult(0, _stat(pid, proc["start"], comm=proc.get("comm", "python")), "")
        if words[0] == "kill":
            if self._kill_fails:
                return CommandResult(1, "", self._kill_fails)
            self.processes[int(words[3])]["signalled"] = True
            return CommandResult(0, "", "")
        raise AssertionError(f"not a catalogue command: {command}")


async def _no_sleep(_: float) -> None:
    return None


async def _execute(op, node, *, verify_timeout_s=20.0, clock=None):
    ticks = iter(range(10_000))
    return await catalogue.execute(
        op, node.run, verify_timeout_s=verify_timeout_s, sleep=_no_sleep, clock=clock or (lambda: next(ticks) * 0.5)
    )


async def test_kill_checks_start_time_and_command_then_verifies():
    node = _Node({4242: {"start": 500, "cmd": "python train.py"}})
    result = await _execute(_op(ProcessTarget(pid=4242, start_ticks=500, command="python train.py")), node)
    assert result.outcome is ActionOutcome.SUCCEEDED
    assert result.detail == "sent KILL to 4242; verified gone: 4242"
    assert result.steps == node.commands == [
        GPU_QUERY,
        *HOLDERS,
        "cat /proc/4242/stat",
        "cat /proc/4242/cmdline",
        "kill -s KILL 4242",
        "cat /proc/4242/stat",
    ]


async def test_a_zombie_counts_as_dead():
    node = _Node({4242: {"start": 500, "cmd": "x", "zombie": True}})
    result = await _execute(_op(_t(4242)), node)
    assert result.outcome is ActionOutcome.SUCCEEDED


async def test_recycled_pid_is_refused_and_not_killed():
    node = _Node({4242: {"start": 999, "cmd": "bash", "comm": "bash"}})
    result = await _execute(_op(ProcessTarget(pid=4242, start_ticks=500, command="python train.py")), node)
    assert result.outcome is ActionOutcome.FAILED
    assert result.detail == "refused 4242: start time 999 != expected 500 (the pid was recycled; now 'bash')"
    assert node.commands == [GPU_QUERY, *HOLDERS, "cat /proc/4242/stat"]
    assert not any(c.startswith("kill") for c in node.commands)


async def test_different_command_line_is_refused():
    node = _Node({4242: {"start": 500, "cmd": "python serve.py"}})
    result = await _execute(_op(ProcessTarget(pid=4242, start_ticks=500, command="python train.py")), node)
    assert result.outcome is ActionOutcome.FAILED
    assert "refused 4242: command line 'python serve.py' != expected 'python train.py'" in result.detail
    assert node.commands == [GPU_QUERY, *HOLDERS, "cat /proc/4242/stat", "cat /proc/4242/cmdline"]


async def test_missing_process_counts_as_already_gone():
    node = _Node({})
    result = await _execute(_op(_t(4242)), node)
    assert result.outcome is ActionOutcome.SUCCEEDED
    assert result.detail == "already gone: 4242"
    assert node.commands == [GPU_QUERY, *HOLDERS, "cat /proc/4242/stat"]


async def test_one_refused_target_does_not_stop_the_others_but_fails_the_action():
    node = _Node({10: {"start": 1, "cmd": "a"}, 11: {"start": 7, "cmd": "b"}})
    result = await _execute(_op(_t(10, 2, "a"), _t(11, 7, "b")), node)
    assert result.outcome is ActionOutcome.FAILED
    assert "sent KILL to 11" in result.detail and "refused 10" in result.detail
    assert "kill -s KILL 10" not in node.commands


async def test_process_that_survives_the_signal_fails_after_the_verify_timeout():
    node = _Node({4242: {"start": 500, "cmd": "x"}}, dies_after_polls=10**6)
    result = await _execute(_op(_t(4242), signal="TERM"), node, verify_timeout_s=2.0)
    assert result.outcome is ActionOutcome.FAILED
    assert result.detail.endswith("pid 4242 still alive after 2s of SIGTERM")
    polls = [c for c in node.commands[4:] if c == "cat /proc/4242/stat"]
    assert 2 <= len(polls) <= 6


async def test_process_that_dies_slowly_is_verified_by_polling():
    node = _Node({4242: {"start": 500, "cmd": "x"}}, dies_after_polls=3)
    result = await _execute(_op(_t(4242)), node)
    assert result.outcome is ActionOutcome.SUCCEEDED
    assert node.commands.count("cat /proc/4242/stat") == 1 + 4


async def test_failed_kill_is_reported_with_the_nodes_words():
    node = _Node({4242: {"start": 500, "cmd": "x"}}, kill_fails="kill: (4242) - Operation not permitted\n")
    result = await _execute(_op(_t(4242)), node)
    assert result.outcome is ActionOutcome.FAILED
    assert "kill -s KILL 4242 failed: 'kill: (4242) - Operation not permitted'" in result.detail


# --- the GPU must still be in the state the incident describes --------------------------------


async def test_a_gpu_busy_again_refuses_the_kill_and_touches_nothing():
    node = _Node({4242: {"start": 500, "cmd": "x"}}, gpu=CommandResult(0, "85\n", ""))
    result = await _execute(_op(_t(4242), busy_above=5), node)
    assert result.outcome is ActionOutcome.BLOCKED
    assert result.detail == (
        "refused: GPU 0 is busy again (85% > 5%), so the job is not the zombie the incident describes; nothing was killed"
    )
    assert node.commands == [GPU_QUERY]


async def test_a_gpu_at_the_limit_still_counts_as_idle():
    node = _Node({4242: {"start": 500, "cmd": "x"}}, gpu=CommandResult(0, "5\n", ""))
    assert (await _execute(_op(_t(4242), busy_above=5), node)).outcome is ActionOutcome.SUCCEEDED


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (CommandResult(0, "[N/A]\n", ""), "invalid literal"),
        (CommandResult(0, "250\n", ""), "not a percentage"),
        (CommandResult(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", ""), "NVIDIA driver"),
        (CommandResult(127, "", "sh: 1: nvidia-smi: not found\n"), "not found"),
    ],
)
async def test_a_gpu_whose_state_cannot_be_read_refuses_the_kill(answer, words):
    node = _Node({4242: {"start": 500, "cmd": "x"}}, gpu=answer)
    result = await _execute(_op(_t(4242)), node)
    assert result.outcome is ActionOutcome.BLOCKED
    assert result.detail.startswith("refused: GPU 0's utilisation cannot be read on the node (")
    assert words in result.detail and result.detail.endswith("nothing is killed blind")
    assert node.commands == [GPU_QUERY]


def test_the_operation_table_is_whole_and_the_gate_asks_it_not_the_types():
    """Every operation an ActionRequested may carry has one entry, and the gate and the handler
    read what differs between operations from that entry, never from an isinstance of their own."""
    import ast
    import typing
    from pathlib import Path

    from gpumedic_events import OPERATION_NAMES, Operation

    carried = typing.get_args(typing.get_args(Operation)[0])
    assert set(catalogue.OPERATIONS) == set(carried)
    assert {kind.model_fields["operation"].default for kind in catalogue.OPERATIONS} == set(OPERATION_NAMES)
    assert set(catalogue.NOT_FIXES) == {"drain_node", "undrain_node", "spawn_worker", "requeue_tasks", "mark_worker_ended",
                                        "restart_job", "accept_worker"}
    names = set(OPERATION_NAMES) | {kind.__name__ for kind in carried}
    package = Path(catalogue.__file__).parent.parent
    # The incident's own course names two (an undrain after a drain's fix, a job's restart after a
    # kill's), and the ledger looks up the verified kill or job stop a restart follows.
    course = {"gate.py": {"undrain_node", "restart_job"}, "handlers.py": set(), "repository.py": {"kill_gpu_processes", "stop_job"}}
    for module, named in course.items():
        tree = ast.parse((package / module).read_text())
        branches = [
            ast.unparse(node) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"
            and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node.args[1]))
        ]
        strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in OPERATION_NAMES}
        assert (branches, strings - named) == ([], set()), module
