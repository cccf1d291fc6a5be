"""docker_prune: free /var/lib/docker on a disk-pressure incident.

What goes: stopped containers, dangling images, the build cache; unused volumes only when the
request asks and the policy allows it (a volume may be the only copy of someone's data). Before,
`docker system df` says what is reclaimable; after, `df` on /var/lib/docker says what was freed,
so the audit shows both the promise and the result.
"""

from __future__ import annotations

import re

from gpumedic_events import ActionOutcome, DockerPrune
from gpumedic_incidents.policy import Actions
from remediator.catalogue.base import CommandResult, ExecutionResult, InvalidParameter, Means, Node, said

DOCKER_ROOT = "/var/lib/docker"
RECLAIMABLE = "docker system df --format '{{.Type}}={{.Reclaimable}}'"
USAGE = f"df --block-size=1 --output=used {DOCKER_ROOT}"
PRUNES = ("docker container prune --force", "docker image prune --force", "docker builder prune --force")
VOLUME_PRUNE = "docker volume prune --force"

_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kKMGTP]?B)")
_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
"""Docker prints sizes in decimal units (go-units HumanSize)."""


def render(operation: DockerPrune, actions: Actions) -> tuple[str, ...]:
    if operation.volumes and not actions.docker_prune.volumes:
        raise InvalidParameter("the request asks to prune volumes, which the policy does not allow (docker_prune.volumes)")
    prunes = (*PRUNES, VOLUME_PRUNE) if operation.volumes else PRUNES
    return (RECLAIMABLE, USAGE, *prunes, USAGE)


def parse_size(text: str) -> int:
    """'12.5GB (80%)' -> 12500000000; raises ValueError on anything else."""
    match = _SIZE.search(text)
    if match is None:
        raise ValueError(f"not a size: {text[:60]!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def parse_used(result: CommandResult) -> int | None:
    """`df --output=used` bytes (header, then the number), None if unreadable."""
    lines = result.stdout.split()
    return int(lines[-1]) if result.exit_status == 0 and lines and lines[-1].isdigit() else None


async def execute(operation: DockerPrune, node: Node, means: Means) -> ExecutionResult:
    actions = means.actions
    reclaimable_cmd, usage_cmd, *prunes, _ = render(operation, actions)
    result = await node.run(reclaimable_cmd)
    if result.exit_status != 0:
        return node.result(ActionOutcome.FAILED, f"docker system df failed: {said(result)}; nothing pruned")
    expected = 0
    for line in result.stdout.splitlines():
        kind, _, size = line.partition("=")
        if kind.strip() == "Local Volumes" and not operation.volumes:
            continue
        try:
            expected += parse_size(size)
        except ValueError:
            continue  # a type with nothing reclaimable prints '0B'; anything odd counts as nothing
    before = parse_used(await node.run(usage_cmd))
    failures = []
    for prune in prunes:
        result = await node.run(prune)
        if result.exit_status != 0:
            failures.append(f"`{prune}` failed: {said(result)}")
    after = parse_used(await node.run(usage_cmd))
    freed = f"freed {_gb(before - after)}" if before is not None and after is not None else "freed an unknown amount (df unreadable)"
    detail = f"expected to free {_gb(expected)} (docker system df); {freed} on {DOCKER_ROOT}"
    if failures:
        return node.result(ActionOutcome.FAILED, "; ".join([detail, *failures]))
    return node.result(ActionOutcome.SUCCEEDED, detail)


def _gb(size: int) -> str:
    return f"{size / 10**9:.1f} GB"
