"""`gpumedic enroll` and `gpumedic unenroll`: node-sampler onto the fleet's nodes over SSH, and off again.

Each node is reached as the remediator reaches it (the inventory's user, port, key and jump host,
host keys checked) and first asked what it is: CPU, python3 and its C library, whether systemd
runs and the login is root, free disk, what is installed. Everything then goes in one directory
owned by the login user: `/workspace/.gpumedic` where the node has a writable `/workspace` (a
RunPod pod's volume, which outlives the pod's restarts; its container disk does not), else
`~/.gpumedic`. In it: the artifact (see `artifact`) unpacked in `versions/V` with `current`
pointing at it, the node's own NATS credentials (`node.env`) and the CA, mode 0600, and the
control script `bin/gpumedic-node`. The sampler runs under systemd where the login is root on a
systemd host (the unit `gpumedic-node-sampler.service`), and otherwise (a rented pod: no systemd,
maybe not root) under the supervisord the artifact carries; the inventory then records
`service_manager: supervisor` (and `gpumedic_dir` where it is not `~/.gpumedic`) for the node, so
`restart_unit` goes through it, and starts the supervisor again after the pod restarted.

Idempotent: a node already at this version is only started if it is not running. `--upgrade`
unpacks the new version beside the old, switches `current` in one rename and restarts the
sampler once. `unenroll` stops it and removes the unit and `~/.gpumedic`; nothing else was put
there. Many nodes run at once; each ends in one line, a failure saying why.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Awaitable, Callable, Iterable
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from gpumedic.deployment import read_env
from gpumedic.enroll.artifact import NODE_FILES, ArtifactError, Platform, artifact_version, build_artifact
from gpumedic.output import clip, printable
from gpumedic_nodes.inventory import InventoryError
from gpumedic_nodes.ssh import NodeError, NodeSession, SshExecutor

UNIT = "gpumedic-node-sampler.service"
PROGRAM = "gpumedic-node-sampler"
MIN_FREE_MB = 200
STARTED_WITHIN_S = 30.0
PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._/+-]{0,200}$")
ANSWERS = {
    # what each answer of the probe may be; anything else is a node's bad answer, refused by name
    "home": (PLAIN_PATH, "a plain absolute path"),
    "dir": (PLAIN_PATH, "a plain absolute path"),
    "workspace": (PLAIN_PATH, "a plain absolute path"),
    "python": (PLAIN_PATH, "a plain absolute path"),
    "user": (re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,63}\$?$"), "a user name"),
    "uid": (re.compile(r"^[0-9]{1,10}$"), "a user id of at most 10 digits"),
    "machine": (re.compile(r"^[A-Za-z0-9_-]{1,32}$"), "a machine name such as x86_64"),
    "pyver": (re.compile(r"^[0-9]{1,3}\.[0-9]{1,3}$"), "a Python version such as 3.11"),
    "libc": (re.compile(r"^[A-Za-z0-9._-]{0,64}$"), "a C library such as glibc-2.36"),
    "systemd": (re.compile(r"^yes$"), "yes"),
    "installed": (re.compile(r"^[A-Za-z0-9.+_-]{1,64}$"), "a version"),
    "free_kb": (re.compile(r"^[0-9]{0,19}$"), "a count of KiB of at most 19 digits"),
}
"""The node's answers are data, never control: they go into commands, a unit file, the inventory
and the operator's terminal, so each is checked against its form (with bounds) before use."""

PROBE = r"""
echo "home=$HOME"
echo "user=$(id -un)"
echo "uid=$(id -u)"
echo "machine=$(uname -m)"
py=$(command -v python3 || true)
echo "python=$py"
if [ -n "$py" ]; then "$py" -c 'import platform, sys; print("pyver=%d.%d" % sys.version_info[:2]); print("libc=%s-%s" % platform.libc_ver())'; fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then echo "systemd=yes"; fi
where=$HOME
if [ -d /workspace ] && [ -w /workspace ]; then echo "workspace=/workspace"; where=/workspace; fi
for d in /workspace/.gpumedic "$HOME/.gpumedic"; do
  if [ -f "$d/current/VERSION" ] && [ -O "$d" ]; then echo "dir=$d"; echo "installed=$(cat "$d/current/VERSION")"; break; fi
done
echo "free_kb=$(df -Pk "$where" 2>/dev/null | awk 'NR==2 {print $4}')"
"""
"""Read-only: what decides how (and whether) the node can be enrolled."""


class EnrollError(Exception):
    """This node cannot be enrolled (or checked, or unenrolled); the message says why."""


@dataclass(frozen=True)
class NodeFacts:
    home: str
    user: str
    uid: int
    machine: str
    python: str
    python_version: str
    libc: str
    systemd: bool
    free_mb: int | None
    installed: str | None
    workspace: str | None = None
    installed_dir: str | None = None

    @property
    def directory(self) -> str:
        """Where gpumedic is (or goes) on the node: where it is, else the persistent volume, else home."""
        return self.installed_dir or f"{self.workspace or self.home}/.gpumedic"

    @property
    def control(self) -> str:
        return f"{shlex.quote(self.directory)}/bin/gpumedic-node"

    @property
    def manager(self) -> str:
        """systemd where the login may install a unit (root on a systemd host), else the carried supervisor."""
        return "systemd" if self.systemd and self.uid == 0 else "supervisor"

    @classmethod
    def parse(cls, text: str) -> NodeFacts:
        found = {key: value for key, value in (line.split("=", 1) for line in text.splitlines() if "=" in line) if key in ANSWERS}
        if not found.get("python"):
            raise EnrollError("no python3 on the node (install python3, 3.11 or newer)")
        bad = [f"{key}='{printable(value[:40])}{'...' if len(value) > 40 else ''}' ({len(value)} characters), which is not {ANSWERS[key][1]}"
               for key, value in found.items() if value and not ANSWERS[key][0].match(value)]
        if bad:
            raise EnrollError(f"the node answered {'; '.join(bad)}; not enrolled")
        free, uid = found.get("free_kb", ""), found.get("uid", "")
        return cls(
            home=found.get("home", ""), user=found.get("user", ""), uid=int(uid) if uid.isdigit() else -1,
            machine=found.get("machine", ""), python=found["python"], python_version=found.get("pyver", ""),
            libc=found.get("libc", ""), systemd=found.get("systemd") == "yes",
            free_mb=int(free) // 1024 if free.isdigit() else None, installed=found.get("installed") or None,
            workspace=found.get("workspace") or None, installed_dir=found.get("dir") or None,
        )


@dataclass(frozen=True)
class Outcome:
    """One node's result: one line for a person."""

    node_id: str
    ok: bool
    line: str
    manager: str | None = None
    directory: str | None = None
    """Where gpumedic is on the node, when it is not ~/.gpumedic (the inventory's `gpumedic_dir`)."""


@dataclass
class Artifacts:
    """The artifact per platform, built once however many nodes share it (or the one given)."""

    cache: Path
    given: Path | None = None
    _built: dict[Platform, tuple[Path, str]] = field(default_factory=dict)
    _locks: dict[Platform, asyncio.Lock] = field(default_factory=dict)

    async def for_platform(self, platform: Platform) -> tuple[Path, str]:
        if self.given is not None:
            return self.given, artifact_version(self.given)
        async with self._locks.setdefault(platform, asyncio.Lock()):
            if platform not in self._built:
                self._built[platform] = await asyncio.to_thread(build_artifact, platform, self.cache)
            return self._built[platform]


@dataclass(frozen=True)
class Credentials:
    """Where each node's NATS credentials and the CA come from: `gpumedic init`'s deploy/secrets
    (or the embedded stack's var/secrets): nodes/NODE.env and tls/ca.pem."""

    secrets: Path
    nats_url: str | None = None
    """The address the nodes reach NATS by, when not the one in their env file."""

    def node_env(self, node_id: str, ca_path: str) -> bytes:
        path = self.secrets / "nodes" / f"{node_id}.env"
        try:
            rows = read_env(path) if path.is_file() else None
        except OSError as exc:
            rows, why = None, exc.strerror or str(exc)
        else:
            why = "no such file"
        if rows is None:
            raise EnrollError(f"no credentials for it: {path} cannot be read ({why}); `gpumedic init --node {node_id}` writes them")
        for number, (key, _, line) in enumerate(rows, 1):
            if not key and line.strip() and not line.lstrip().startswith("#"):
                raise EnrollError(f"{path} line {number} is not KEY=VALUE")
        values = {key: value or "" for key, value, _ in rows if key}
        values["GPUMEDIC_NATS_TLS_CA_FILE"] = ca_path
        if self.nats_url:
            values["GPUMEDIC_NATS_URL"] = self.nats_url
        if values.get("GPUMEDIC_SAMPLER_NODE_ID", node_id) != node_id:
            raise EnrollError(f"{path} is for node {values['GPUMEDIC_SAMPLER_NODE_ID']!r}, not {node_id!r}")
        values["GPUMEDIC_SAMPLER_NODE_ID"] = node_id
        return "".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items()).encode()

    def ca(self) -> bytes:
        path = self.secrets / "tls" / "ca.pem"
        try:
            return path.read_bytes()
        except OSError as exc:
            raise EnrollError(f"the CA {path} cannot be read ({exc.strerror or exc})") from None


def failure_line(exc: BaseException) -> str:
    """Why a node failed, in one line: the causes an operator acts on named plainly."""
    if isinstance(exc, NodeError):
        if exc.code == "host_key_changed":
            return f"host key changed or unknown: {exc.cause}"
        if exc.code == "auth_refused":
            return f"permission denied as {exc.address.user}: {exc.cause}"
        return exc.cause
    return str(exc) or type(exc).__name__


async def _run(session: NodeSession, command: str, what: str, *, timeout_s: float | None = None) -> str:
    result = await session.run(command, timeout_s=timeout_s)
    if result.exit_status != 0:
        said = printable(" ".join((result.stderr or result.stdout).split())[-300:]) or f"exit status {result.exit_status}"
        if "No space left on device" in said:
            raise EnrollError(f"disk full while {what}: {said}")
        if "Permission denied" in said:
            raise EnrollError(f"permission denied as {session.address.user} while {what}: {said}")
        raise EnrollError(f"{what} failed: {said}")
    return result.stdout


async def _write(session: NodeSession, path: str, data: bytes, what: str, *, mode: int = 0o600) -> None:
    result = await session.write_file(path, data, mode=mode, timeout_s=300)
    if result.exit_status != 0:
        said = printable(" ".join(result.stderr.split())[-300:]) or f"exit status {result.exit_status}"
        raise EnrollError(f"{'disk full' if 'No space left' in said else 'could not write'} {what}: {said}")


async def probe(session: NodeSession) -> NodeFacts:
    return NodeFacts.parse(await _run(session, PROBE, "asking the node what it is"))


async def _wait_active(session: NodeSession, facts: NodeFacts) -> bool:
    deadline = asyncio.get_running_loop().time() + STARTED_WITHIN_S
    while True:
        answer = await session.run(f"{facts.control} is-active {PROGRAM}")
        if answer.exit_status == 0 and answer.stdout.strip() == "active":
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(1)


async def enroll_node(session: NodeSession, artifacts: Artifacts, credentials: Credentials, *, upgrade: bool = False) -> Outcome:
    """Put the sampler on one node (or upgrade it, or only start it); raises EnrollError saying why not."""
    node_id = session.node_id
    facts = await probe(session)
    try:
        platform = Platform.of(facts.machine, facts.python_version, facts.libc)
    except ArtifactError as exc:
        raise EnrollError(str(exc)) from None
    path, version = await artifacts.for_platform(platform)
    control, where = facts.control, _elsewhere(facts)
    if facts.installed == version or (facts.installed and not upgrade):
        if not await _wait_active(session, facts):
            await _run(session, f"{control} start", "starting the sampler")
            if not await _wait_active(session, facts):
                raise EnrollError(f"enrolled at {facts.installed}, but the sampler does not stay up (see {facts.directory}/log/)")
            return Outcome(node_id, True, f"enrolled at {facts.installed}; was stopped, started ({facts.manager})", facts.manager, where)
        hint = "" if facts.installed == version else f"; `--upgrade` replaces it with {version}"
        return Outcome(node_id, True, f"already enrolled at {facts.installed}, running ({facts.manager}){hint}", facts.manager, where)
    if facts.free_mb is not None and facts.free_mb < MIN_FREE_MB:
        raise EnrollError(f"disk full: {facts.free_mb} MB free for {facts.directory}, enrolment needs {MIN_FREE_MB} MB")

    d = shlex.quote(facts.directory)
    env = credentials.node_env(node_id, f"{facts.directory}/ca.pem")
    ca = credentials.ca()
    v = shlex.quote(version)
    await _run(session, f"mkdir -p {d}/bin {d}/run {d}/log {d}/supervisor.d {d}/versions && chmod 700 {d}", f"making {facts.directory}")
    await _write(session, f"{d}/versions/{v}.tar.gz", path.read_bytes(), "the artifact")
    await _run(session, f"cd {d}/versions && rm -rf {v} && mkdir {v} && tar -xzf {v}.tar.gz -C {v} && rm -f {v}.tar.gz",
               "unpacking the artifact", timeout_s=300)
    # the sampler starts in a second or two with its bytecode compiled once here
    await session.run(f"{shlex.quote(facts.python)} -m compileall -q -j 0 {d}/versions/{v}/site >/dev/null 2>&1", timeout_s=600)
    await _write(session, f"{d}/node.env", env, "the node's credentials")
    await _write(session, f"{d}/ca.pem", ca, "the CA")
    await _write(session, f"{d}/python", f"{facts.python}\n".encode(), "the interpreter's path")
    await _write(session, f"{d}/manager", f"{facts.manager}\n".encode(), "the service manager")
    await _write(session, f"{d}/supervisord.conf", (NODE_FILES / "supervisord.conf").read_bytes(), "the supervisor's settings")
    await _write(session, control, (NODE_FILES / "gpumedic-node").read_bytes(), "the control script", mode=0o700)
    await _run(session, f"cd {d} && ln -sfn versions/{v} current.new && mv -T current.new current", "switching to the new version")
    if facts.manager == "systemd":
        unit = (NODE_FILES / UNIT).read_text().replace("@DIR@", facts.directory).encode()
        await _write(session, f"/etc/systemd/system/{UNIT}", unit, "the systemd unit", mode=0o644)
        await _run(session, f"systemctl daemon-reload && systemctl enable {UNIT} >/dev/null 2>&1", "enabling the unit")
    verb = "restart" if facts.installed else "start"
    await _run(session, f"{control} restart {PROGRAM}" if facts.installed else f"{control} start", f"{verb}ing the sampler")
    if not await _wait_active(session, facts):
        raise EnrollError(f"installed {version}, but the sampler does not stay up (see {facts.directory}/log/ or journalctl -u {UNIT})")
    await session.run(f"cd {d}/versions && for v in *; do [ \"$v\" = {v} ] || rm -rf \"$v\"; done")
    done = f"upgraded {facts.installed} -> {version}" if facts.installed else f"enrolled {version}"
    return Outcome(node_id, True, f"{done}; running under {facts.manager} as {facts.user} in {facts.directory}", facts.manager, where)


def _elsewhere(facts: NodeFacts) -> str | None:
    return None if facts.directory == f"{facts.home}/.gpumedic" else facts.directory


async def check_node(session: NodeSession) -> Outcome:
    """What runs on the node: version, supervisor, state, since when, what the sampler cannot see."""
    facts = await probe(session)
    if not facts.installed:
        return Outcome(session.node_id, False, "not enrolled")
    answer = await session.run(f"{facts.control} status")
    lines = [line for line in answer.stdout.splitlines() if "=" in line]
    found = dict(line.split("=", 1) for line in lines if not line.startswith("cannot="))
    cannot = [line.removeprefix("cannot=") for line in lines if line.startswith("cannot=")]
    state = found.get("state", "unknown")
    failing = found.get("failing", "").strip()
    running = state in ("active", "RUNNING") and not failing
    manager = found.get("manager") if found.get("manager") in ("systemd", "supervisor") else None
    line = f"{clip(found.get('version', '?'), 64)} {clip(state.lower(), 32)} under {manager or clip(found.get('manager', '?'), 32)}"
    if found.get("since"):
        line += f" since {clip(found['since'], 64)}"
    if found.get("restarts", "0").strip() not in ("", "0"):
        line += f", restarted {clip(found['restarts'].strip(), 8)} time(s)"
    if failing:
        line += f"\n    failing: {clip(failing, 300)}"
    line += "".join(f"\n    cannot see: {clip(what, 200)}" for what in cannot[:20])
    return Outcome(session.node_id, running, line, manager, _elsewhere(facts))


def seen_or_not(outcome: Outcome, seen: float | str | None) -> Outcome:
    """An enrolled node's line with what the bus saw of it: its first sample (seconds after the
    wait began), a reason nobody looked, or none in time (a failure: "ok" means the node is seen)."""
    if isinstance(seen, float):
        return dataclasses.replace(outcome, line=f"{outcome.line}; first sample on the bus after {seen:.1f}s")
    if isinstance(seen, str):
        return dataclasses.replace(outcome, line=f"{outcome.line}; first sample {seen}")
    return dataclasses.replace(outcome, ok=False, line=f"{outcome.line}\n    but no sample reached the bus in time: "
                               f"`gpumedic enroll --check --node {outcome.node_id}` says why (the sampler's last error)")


async def unenroll_node(session: NodeSession) -> Outcome:
    """Stop the sampler and remove everything enroll put on the node."""
    facts = await probe(session)
    script = (
        f"if [ -x {facts.control} ]; then {facts.control} stop; fi; "
        f"if [ -f /etc/systemd/system/{UNIT} ]; then rm -f /etc/systemd/system/{UNIT} && systemctl daemon-reload; fi; "
        f"rm -rf {shlex.quote(facts.directory)}"
    )
    await _run(session, script, "removing the sampler")
    was = f"removed {facts.installed}" if facts.installed else "nothing was enrolled; nothing left"
    return Outcome(session.node_id, True, was, facts.manager)


async def for_each_node(
    executor: SshExecutor,
    nodes: Iterable[str],
    work: Callable[[NodeSession], Awaitable[Outcome]],
    *,
    concurrency: int = 16,
    advance: Callable[[Outcome], None] = lambda outcome: None,
) -> list[Outcome]:
    """`work` on every node, `concurrency` at a time; a node that fails is one line, never the end of the run."""
    limit = asyncio.Semaphore(concurrency)

    async def one(node_id: str) -> Outcome:
        async with limit:
            try:
                async with executor.session(node_id) as session:
                    outcome = await work(session)
            except (EnrollError, NodeError, InventoryError, ArtifactError) as exc:
                outcome = Outcome(node_id, False, failure_line(exc))
            except OSError as exc:  # this machine's side: an unreadable artifact or secret
                outcome = Outcome(node_id, False, f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 (whatever one node did, the others still get their line)
                outcome = Outcome(node_id, False, f"unexpected {type(exc).__name__}: {clip(str(exc), 300)}")
        advance(outcome)
        return outcome

    return list(await asyncio.gather(*(one(node) for node in nodes)))
