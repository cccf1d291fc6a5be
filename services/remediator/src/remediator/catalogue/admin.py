"""http_admin: one admin endpoint of a peer daemon, from the policy's closed list.

The request names the endpoint (`force_election`), never a URL: the policy maps the name to a
loopback URL, the nodes it may be called for, where it is called (the incident's node, or the
cluster's leader the request names in `at`) and its JSON body, whose only values from the
incident are its node id (validated, JSON-encoded and quoted). curl runs on that node itself, so
the daemon needs no port open to the control plane. The bearer token (the remediator's
GPUMEDIC_REMEDIATOR_ADMIN_TOKEN_FILE) goes to curl on stdin as a header (`-H @-`): it is never
on a command line, where `ps`, the audit log or the ledger could show it. The call counts when
the service answers 2xx.
"""

from __future__ import annotations

import json

from gpumedic_events import ENDPOINT_PATTERN, ActionOutcome, HttpAdmin
from gpumedic_incidents.policy import Actions, AdminEndpoint, NodeScoped
from remediator.catalogue.base import ExecutionResult, Fit, InvalidParameter, Means, allowed_name, quoted, said, short

TIMEOUT_S = 10
CURL = f"curl -fsS -m {TIMEOUT_S} -X POST -H @- -H 'Content-Type: application/json' -o /dev/null -w '%{{http_code}}' --data-raw"
"""The fixed form: POST a JSON body, headers (the token) from stdin, print the status; then the
body and the URL, each one quoted word."""


def validate_endpoint(value: object, actions: Actions) -> str:
    return allowed_name(value, ENDPOINT_PATTERN, actions.http_admin.endpoints, what="endpoint",
                        form="an endpoint name (lower-case letters, digits and _)", listed_in="http_admin list")


def endpoint_of(operation: HttpAdmin, actions: Actions) -> AdminEndpoint:
    """The policy's endpoint, checked against where the request calls it."""
    endpoint = actions.http_admin.endpoints[validate_endpoint(operation.endpoint, actions)]
    if endpoint.target == "leader" and operation.at is None:
        raise InvalidParameter(f"endpoint {operation.endpoint} is called on the cluster's leader, and the request names none (at)")
    if endpoint.target == "node" and operation.at is not None:
        raise InvalidParameter(f"endpoint {operation.endpoint} is called on the incident's node only, not on {short(operation.at)}")
    return endpoint


def command(endpoint: AdminEndpoint, node_id: str) -> str:
    body = json.dumps(endpoint.fill(node_id), separators=(",", ":"))
    return f"{CURL} {quoted(body)} {quoted(endpoint.url)}"


def render(operation: HttpAdmin, actions: Actions) -> tuple[str, ...]:
    """With the body's {node_id} as written: the node is the request's, filled in when it runs."""
    return (command(endpoint_of(operation, actions), "{node_id}"),)


def fits(operation: HttpAdmin, fit: Fit) -> str:
    """The endpoint is the kind's own; one called on the leader goes to the leader leader-health
    last reported for the node's cluster, not to the one the request names."""
    endpoint = getattr(fit.rules, "election_endpoint", None) or getattr(fit.rules, "reset_endpoint", None)
    if operation.endpoint != endpoint:
        return f"kinds.{fit.kind} calls the {endpoint or 'no'} endpoint, not {operation.endpoint}"
    listed = fit.actions.http_admin.endpoints.get(operation.endpoint)
    if listed is None or listed.target != "leader":
        return ""
    known = fit.leader
    rule = f"actions.http_admin.endpoints.{operation.endpoint} is called on the leader leader-health reports"
    if known is None:
        return f"no check of leader-health names node {fit.incident.node_id}'s cluster, so its leader is not known ({rule})"
    checked = known.checked_at.isoformat(timespec="seconds")
    age_s = (fit.now - known.checked_at).total_seconds()
    if age_s > fit.max_age_s:
        return (f"leader-health last checked cluster {known.cluster} {age_s:.0f}s ago (limit {fit.max_age_s:g}s), "
                f"so its leader is not known now ({rule})")
    if known.leader is None:
        return f"leader-health's check of cluster {known.cluster} at {checked} found no leader ({rule})"
    if operation.at != known.leader:
        return (f"the request calls {operation.endpoint} on {operation.at}, but leader-health's check of cluster "
                f"{known.cluster} at {checked} names {known.leader} as its leader ({rule})")
    return ""


def scope(operation: HttpAdmin, actions: Actions) -> tuple[NodeScoped, str, str] | None:
    if endpoint := actions.http_admin.endpoints.get(operation.endpoint):
        return endpoint, f"{operation.endpoint} may be called", "actions.http_admin.endpoints"
    return None


def header(token: str | None) -> str:
    """What curl reads on stdin: the Authorization header, or nothing without a token."""
    return f"Authorization: Bearer {token}\n" if token else ""


async def execute(operation: HttpAdmin, means: Means) -> ExecutionResult:
    endpoint = endpoint_of(operation, means.actions)
    node_id = means.need("request").node_id if endpoint.body else ""  # only a body names the incident's node
    where = f"{operation.at}'s service" if operation.at else "the node's service"
    async with means.node(operation.at) as node:
        result = await node.run(command(endpoint, node_id), input=header(means.admin_token()))
        status = result.stdout.strip()
        if result.exit_status == 0 and status.startswith("2"):
            return node.result(ActionOutcome.SUCCEEDED, f"{operation.endpoint}: {where} answered HTTP {status}")
        answered = f"HTTP {status}" if status.isdigit() and status != "000" else said(result)
        return node.result(ActionOutcome.FAILED, f"{operation.endpoint}: {where} did not take it ({answered})")
