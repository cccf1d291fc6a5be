"""restart_unit and reboot_node: the node's service manager.

A unit is restarted only if the policy's allow-list names it (the job daemon, the P2P node, the
sampler: never sshd, never an arbitrary name from a message), through what runs the node's
services (the inventory's `service_manager`): systemd; the supervisor `gpumedic enroll` carries to
a node without systemd (a rented pod), whose control script also starts the supervisor when the
pod restarted without it; or Docker, a container named like the unit without `.service`. The
restart counts only when the manager says the service runs again within the verify timeout and,
where the policy gives one, the unit's health endpoint on the node's loopback answers.

A reboot is the last rung, and the policy must enable it explicitly (its mode is `observe`
unless changed). Its verification is the node's next samples: the SSH session ends with it.
"""

from __future__ import annotations

from gpumedic_events import UNIT_PATTERN, ActionOutcome, RebootNode, RestartUnit
from gpumedic_incidents.policy import HEALTH_URL, Actions, NodeScoped
from remediator.catalogue.base import ExecutionResult, Fit, InvalidParameter, Means, Node, allowed_name, quoted, said, short

SUPERVISED = '"$HOME"/.gpumedic/bin/gpumedic-node'
"""The control script `gpumedic enroll` puts on a node without systemd (in the login user's home
unless the inventory's `gpumedic_dir` says where)."""
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
REBOOT = "systemctl reboot"
HEALTH_TIMEOUT_S = 5


def validate_unit(value: object, actions: Actions) -> str:
    return allowed_name(value, UNIT_PATTERN, actions.restart_unit.units, what="unit",
                        form="a systemd service name (letters, digits, ':_.@-', ending in .service)", listed_in="restart_unit allow-list")


def health_command(url: str) -> str:
    if not HEALTH_URL.fullmatch(url):
        raise InvalidParameter(f"health URL {short(url)} is not a plain loopback URL")
    return f"curl -fsS -m {HEALTH_TIMEOUT_S} -o /dev/null {quoted(url)}"


def render_restart(operation: RestartUnit, actions: Actions, manager: str = "systemd", gpumedic_dir: str | None = None) -> tuple[str, ...]:
    unit = validate_unit(operation.unit, actions)
    if manager == "supervisor":
        control = f"{quoted(gpumedic_dir)}/bin/gpumedic-node" if gpumedic_dir else SUPERVISED
        commands = [f"{control} restart {quoted(unit)}", f"{control} is-active {quoted(unit)}"]
    elif manager == "docker":
        name = quoted(unit.removesuffix(".service"))
        commands = [f"docker restart {name}", f"docker inspect --format '{{{{.State.Running}}}}' {name}"]
    else:
        commands = [f"systemctl restart {quoted(unit)}", f"systemctl is-active {quoted(unit)}"]
    if url := actions.restart_unit.units[unit].health_url:
        commands.append(health_command(url))
    return tuple(commands)


def fits_restart(operation: RestartUnit, fit: Fit) -> str:
    """The unit restarted is the one the kind's rules name (its sampler's, its daemon's, an operator's check's)."""
    unit = getattr(fit.rules, "sampler_unit", None) or getattr(fit.rules, "daemon_unit", None) or getattr(fit.rules, "unit", None)
    if operation.unit != unit:
        return f"kinds.{fit.kind} restarts {unit or 'no unit'}, not {operation.unit}"
    return ""


def scope(operation: RestartUnit, actions: Actions) -> tuple[NodeScoped, str, str] | None:
    if unit := actions.restart_unit.units.get(operation.unit):
        return unit, f"{operation.unit} may be restarted", "actions.restart_unit.units"
    return None


RUNNING = {"systemd": "active", "supervisor": "active", "docker": "true"}
"""What each manager's running check prints for a service that runs."""


async def restart(operation: RestartUnit, node: Node, means: Means) -> ExecutionResult:
    manager = node.service_manager
    restart_cmd, is_active, *health = render_restart(operation, means.actions, manager, node.gpumedic_dir)
    unit = operation.unit
    result = await node.run(restart_cmd)
    if result.exit_status != 0:
        return node.result(ActionOutcome.FAILED, f"{manager}: restarting {unit} failed: {said(result)}")
    running = RUNNING.get(manager, "active")
    active, answer = await node.poll_command(is_active, lambda r: r.exit_status == 0 and r.stdout.strip() == running)
    if not active:
        state = answer.stdout.strip() or said(answer)
        return node.result(
            ActionOutcome.FAILED, f"restarted {unit}, but it is {short(state)} after {node.verify_timeout_s:g}s, not active"
        )
    if health:
        answers, answer = await node.poll_command(health[0], lambda r: r.exit_status == 0)
        if not answers:
            return node.result(
                ActionOutcome.FAILED,
                f"restarted {unit}; it is active but its health endpoint does not answer after "
                f"{node.verify_timeout_s:g}s ({said(answer)})",
            )
        return node.result(ActionOutcome.SUCCEEDED, f"restarted {unit} ({manager}); active, and its health endpoint answers")
    return node.result(ActionOutcome.SUCCEEDED, f"restarted {unit} ({manager}); active")


def render_reboot(operation: RebootNode, actions: Actions | None = None) -> tuple[str, ...]:
    return (BOOT_ID, REBOOT)


async def reboot(operation: RebootNode, node: Node, means: Means) -> ExecutionResult:
    boot = await node.run(BOOT_ID)
    before = boot.stdout.strip() if boot.exit_status == 0 else "unknown"
    result = await node.run(REBOOT)
    if result.exit_status != 0:
        return node.result(ActionOutcome.FAILED, f"systemctl reboot failed: {said(result)}")
    return node.result(
        ActionOutcome.SUCCEEDED,
        f"reboot started (boot id was {short(before, 40)}); the node's next samples show whether it came back",
    )
