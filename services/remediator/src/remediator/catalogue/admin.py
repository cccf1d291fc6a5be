"""http_admin: one admin endpoint of the node's own service, from the policy's closed list.

The request names the endpoint (`force_election`), never a URL: the policy maps the name to a
loopback URL on the node and to the nodes it may be called on. curl runs on the node itself, so
the service needs no port open to the control plane. The bearer token (the remediator's
GPUMEDIC_REMEDIATOR_ADMIN_TOKEN_FILE) goes to curl on stdin as a header (`-H @-`): it is never
on a command line, where `ps`, the audit log or the ledger could show it. The call counts when
the service answers 2xx.
"""

from __future__ import annotations

import re

from gpumedic_events import ENDPOINT_PATTERN, ActionOutcome, HttpAdmin
from gpumedic_incidents.policy import Actions
from remediator.catalogue.base import ExecutionResult, InvalidParameter, Means, Node, quoted, said, short

TIMEOUT_S = 10
CURL = f"curl -fsS -m {TIMEOUT_S} -X POST -H @- -H 'Content-Type: application/json' --data-raw '{{}}' -o /dev/null -w '%{{http_code}}'"
"""The fixed form: POST an empty JSON object, headers (the token) from stdin, print the status."""


def validate_endpoint(value: object, actions: Actions) -> str:
    if not isinstance(value, str) or not re.match(ENDPOINT_PATTERN, value):
        raise InvalidParameter(f"endpoint {short(value)} is not an endpoint name (lower-case letters, digits and _)")
    allowed = actions.http_admin.endpoints
    if value not in allowed:
        names = ", ".join(sorted(allowed)) or "none"
        raise InvalidParameter(f"endpoint {value} is not in the policy's http_admin list (allowed: {names})")
    return value


def render(operation: HttpAdmin, actions: Actions) -> tuple[str, ...]:
    name = validate_endpoint(operation.endpoint, actions)
    return (f"{CURL} {quoted(actions.http_admin.endpoints[name].url)}",)


def header(token: str | None) -> str:
    """What curl reads on stdin: the Authorization header, or nothing without a token."""
    return f"Authorization: Bearer {token}\n" if token else ""


async def execute(operation: HttpAdmin, node: Node, means: Means) -> ExecutionResult:
    (command,) = render(operation, means.actions)
    result = await node.run(command, input=header(means.admin_token()))
    status = result.stdout.strip()
    if result.exit_status == 0 and status.startswith("2"):
        return node.result(ActionOutcome.SUCCEEDED, f"{operation.endpoint}: the node's service answered HTTP {status}")
    answered = f"HTTP {status}" if status.isdigit() and status != "000" else said(result)
    return node.result(ActionOutcome.FAILED, f"{operation.endpoint}: the node's service did not take it ({answered})")
