"""`gpumedic init`: the secrets a compose deployment needs, generated instead of typed in.

It writes, beside compose.yaml (none of it is committed; .gitignore lists it):

    .env                               POSTGRES_PASSWORD and one NATS password per service user
    deploy/secrets/tls/                a CA and the NATS server's certificate (nats, localhost and
                                       every --nats-host), so node-samplers verify the server
    deploy/secrets/nats-accounts.conf  the NATS users and their permissions; deploy/nats.conf includes it
    deploy/secrets/nats-routes.conf    the routes of compose's three-server cluster and their password
                                       (deploy/nats-cluster.conf includes it)
    deploy/secrets/nodes/NODE.env      per GPU node: its own NATS user and password, to copy to that node

Running it again keeps every existing secret, adds what is missing (a new node, a placeholder
left in .env), and rewrites the accounts and the server certificate to match.

The containers run as the user who owns these files (GPUMEDIC_UID and GPUMEDIC_GID in .env), never
as root: run by a user, that user; run as root, the images' own user (10001), to whom it gives
deploy/secrets/ and what you put in deploy/remediator/ and deploy/autoscaler/ (run it again
after adding a file there).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from gpumedic.credentials import TlsFiles, ensure_tls, new_password, node_env, render_accounts, write_private
from gpumedic_bus.settings import PLACEHOLDER_PASSWORDS
from gpumedic_bus.topology import CONTROL_USERS, node_user
from gpumedic_events import NodeId

NATS_PORT = 4222
CLUSTER_SERVERS = ("nats", "nats-2", "nats-3")
"""compose's servers: `nats` alone, or all three with deploy/compose.cluster.yaml."""
_LOCAL_NAMES = (*CLUSTER_SERVERS, "localhost", "127.0.0.1")
"""How compose's services and the host itself reach NATS; always in the server certificate."""
ROUTE_PASSWORD = "NATS_ROUTE_PASSWORD"
IMAGE_UID = 10001
"""The user the images create (deploy/images/service.Dockerfile), for a deployment set up as root."""
_CONTAINER_DIRS = ("secrets", "remediator", "autoscaler", "policy")
"""What containers read under deploy/, given to the containers' user when `init` runs as root."""
CA_IN_NODE = "/etc/gpumedic/nats-ca.pem"
"""Where a node's sampler is told to find the CA (copy deploy/secrets/tls/ca.pem there)."""
_ENV_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def password_variable(user: str) -> str:
    """The .env variable holding a service user's password: zombie-detector -> ZOMBIE_DETECTOR_NATS_PASSWORD."""
    return f"{user.upper().replace('-', '_')}_NATS_PASSWORD"


@dataclass(frozen=True)
class Deployment:
    """Where one compose deployment keeps its secrets."""

    root: Path

    @property
    def env_file(self) -> Path:
        return self.root / ".env"

    @property
    def secrets(self) -> Path:
        return self.root / "deploy" / "secrets"

    @property
    def accounts(self) -> Path:
        return self.secrets / "nats-accounts.conf"

    @property
    def routes(self) -> Path:
        return self.secrets / "nats-routes.conf"

    @property
    def console_token(self) -> Path:
        return self.secrets / "console-token"

    @property
    def nodes_dir(self) -> Path:
        return self.secrets / "nodes"

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(self.secrets / "tls")


def read_env(path: Path) -> list[tuple[str, str | None, str]]:
    """(key or '', value, original line) for every line of an env file, comments kept."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        match = _ENV_LINE.match(line) if not line.lstrip().startswith("#") else None
        rows.append((match.group(1), match.group(2), line) if match else ("", None, line))
    return rows


def _is_placeholder(value: str | None) -> bool:
    return value is None or value.strip().strip("'\"").lower() in PLACEHOLDER_PASSWORDS | {""}


def init_deployment(root: Path, *, nodes: Iterable[str] = (), nats_hosts: Iterable[str] = ()) -> list[str]:
    """Generate what is missing; return one line per thing written (no secret in any line)."""
    deploy = Deployment(root)
    done: list[str] = []
    nodes = sorted(set(nodes) | {p.stem for p in deploy.nodes_dir.glob("*.env")})
    for node in nodes:
        try:
            TypeAdapter(NodeId).validate_python(node)
        except ValidationError:
            raise ValueError(f"node id {node!r} is not valid: letters, digits, '-' and '_', at most 63 characters") from None

    # .env: start from the example, keep what is set, fill every placeholder with a real secret.
    rows = read_env(deploy.env_file) or read_env(root / "deploy" / "env.example")
    users = [*CONTROL_USERS]
    wanted = {"POSTGRES_PASSWORD", ROUTE_PASSWORD, *(password_variable(u) for u in users)}
    values = {k: v for k, v, _ in rows if k}
    lines = []
    generated = 0
    for key, value, line in rows:
        if key in wanted and _is_placeholder(value):
            values[key] = new_password()
            line = f"{key}={values[key]}"
            generated += 1
        lines.append(line)
    for key in sorted(wanted - set(values)):
        values[key] = new_password()
        lines.append(f"{key}={values[key]}")
        generated += 1
    as_root = os.geteuid() == 0
    if not values.get("GPUMEDIC_UID"):
        values["GPUMEDIC_UID"] = str(IMAGE_UID if as_root else os.getuid())
        values["GPUMEDIC_GID"] = str(IMAGE_UID if as_root else os.getgid())
        lines += ["# the containers' user: the owner of deploy/secrets/ (never root)",
                  f"GPUMEDIC_UID={values['GPUMEDIC_UID']}", f"GPUMEDIC_GID={values['GPUMEDIC_GID']}"]
    write_private(deploy.env_file, "\n".join(lines) + "\n")
    done.append(f"{deploy.env_file}: {generated} secret(s) generated, {len(wanted) - generated} kept")

    # TLS first: the server certificate names the addresses nodes may reach NATS by.
    tls = ensure_tls(deploy.tls.directory, [*_LOCAL_NAMES, *nats_hosts])
    outside = [*nats_hosts, *(n for n in tls.names() if n not in _LOCAL_NAMES)]
    done.append(f"{tls.cert}: server certificate for {', '.join(tls.names())} (CA {tls.ca})")
    if nodes and not outside:
        done.append("note: GPU nodes reach NATS over the network: run again with --nats-host NAME (the control plane's address)")

    # One user per GPU node, each with its own file to hand to that node.
    passwords = {u: values[password_variable(u)] for u in users}
    url_host = outside[0] if outside else "nats"
    for node in nodes:
        path = deploy.nodes_dir / f"{node}.env"
        existing = {k: v for k, v, _ in read_env(path) if k}
        password = existing.get("GPUMEDIC_NATS_PASSWORD")
        if _is_placeholder(password):
            password = new_password()
            done.append(f"{path}: credentials for node {node} (copy it to that node)")
        passwords[node_user(node)] = password
        write_private(path, node_env(
            node, url=existing.get("GPUMEDIC_NATS_URL") or f"tls://{url_host}:{NATS_PORT}", user=node_user(node), password=password,
            ca_file=CA_IN_NODE, header=f"# gpumedic node-sampler on {node}: copy to that node, with deploy/secrets/tls/ca.pem at {CA_IN_NODE}\n",
        ))

    write_private(deploy.accounts, render_accounts(passwords))
    done.append(f"{deploy.accounts}: {len(passwords)} NATS users ({len(nodes)} node(s))")
    write_private(deploy.routes, render_routes(values[ROUTE_PASSWORD]))

    # The console's token: who has it may silence, mark false positives and reset the breaker.
    if not deploy.console_token.exists() or not deploy.console_token.read_text().strip():
        write_private(deploy.console_token, new_password() + "\n")
        done.append(f"{deploy.console_token}: the web console's token (give it to the operators who may act from the console)")
    if as_root:
        owner = (int(values["GPUMEDIC_UID"]), int(values.get("GPUMEDIC_GID") or values["GPUMEDIC_UID"]))
        given = _give(root / "deploy", owner)
        done.append(f"{given} file(s) under deploy/ given to uid {owner[0]}, the containers' user (not root)")
    return done


def render_routes(password: str) -> str:
    """The cluster block's routes between compose's servers, each logging in with `password`."""
    urls = ", ".join(f'"nats-route://route:{password}@{name}:6222"' for name in CLUSTER_SERVERS)
    return (
        "# generated by `gpumedic init`: the routes of compose's NATS cluster (deploy/compose.cluster.yaml)\n"
        f'authorization {{ user: route, password: "{password}" }}\n'
        f"routes: [{urls}]\n"
    )


def _give(deploy_dir: Path, owner: tuple[int, int]) -> int:
    """chown what containers read under deploy/ to `owner`; the count of files given."""
    count = 0
    for name in _CONTAINER_DIRS:
        top = deploy_dir / name
        if not top.is_dir():
            continue
        for path in [top, *top.rglob("*")]:
            if not path.is_symlink():
                os.chown(path, *owner)
                count += path.is_file()
    return count
