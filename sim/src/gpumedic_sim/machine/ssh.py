"""The simulated node's SSH endpoint: a real asyncssh server that understands the remediator's
exact commands and changes the simulated state the way a Linux shell would.

Only the catalogue's forms are interpreted (a real node runs the same lines unchanged):
`cat /proc/<pid>/stat|cmdline`, `kill -s KILL|TERM <pid>...`, `pgrep -f -a`, the log read (`tail -c` of a regular file that no link
leads to), the `nvidia-smi` queries and
`--gpu-reset`, `fuser /dev/nvidia<gpu>`, `systemctl restart|is-active <unit>` and `systemctl
reboot`, `docker system df` and the prunes, `df` on /var/lib/docker (used, and free beside /),
the `MemAvailable` line of /proc/meminfo, http_admin's curl POST
to the node's own service (its token read from stdin, as curl's `-H @-` does), the checkpoint
step's `kill -s USR1|USR2|INT`, `touch`/`test -e` in /proc/PID/cwd and curl to the jobs' hook. Anything else answers
as a shell that lacks the command (exit 127) and changes nothing. Lines are split with shlex and
matched; nothing is ever evaluated. Every line received is recorded, in order, in
`node.ssh_commands`, so tests and the demo can show exactly what the remediator did.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shlex
from dataclasses import dataclass
from typing import Protocol

import asyncssh

from gpumedic_sim.machine.host import DOCKER_KINDS, SimHost
from gpumedic_sim.machine.parts import UNITS, SimGpu, SimProcess
from remediator.catalogue.admin import CURL
from remediator.logs import READ_SCRIPT

log = logging.getLogger(__name__)

_PROC_FILE = re.compile(r"^/proc/([^/]+)/(stat|cmdline)$")
_SIGNALS = ("KILL", "TERM", "INT", "USR1", "USR2")
_CWD_FILE = re.compile(r"^/proc/([0-9]+)/cwd/([A-Za-z0-9._-]+)$")
"""A file in a process's working directory (where a job is asked to checkpoint)."""
_GPU_QUERIES = {"--query-gpu=utilization.gpu": "utilization", "--query-gpu=memory.used": "memory"}
_DEVICE = re.compile(r"^/dev/nvidia([0-9]+)$")
_GPU_STATE = "--query-gpu=index,utilization.gpu,memory.used,compute_mode"
_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
"""NVML's compute modes as nvidia-smi names them."""
_CURL = shlex.split(CURL)
_LOOPBACK_URL = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?(?P<path>/[A-Za-z0-9._~/-]*)?$")
_PRUNES = {"container": "Containers", "image": "Images", "builder": "Build Cache", "volume": "Local Volumes"}
BOOT_ID = "/proc/sys/kernel/random/boot_id"


class ShellNode(Protocol):
    """What a shell on the node reads and does to it (`NodeState`'s): the commands below are all
    that SSH can reach of a simulated node."""

    node_id: str
    boot_id: str
    gpus: list[SimGpu]
    machine: SimHost
    nvml_missing: bool
    ssh_commands: list[str]
    ssh_stalls: dict[str, float]

    def process(self, pid: int) -> SimProcess | None: ...
    def live_processes(self, gpu: int | None = None) -> list[SimProcess]: ...
    def utilization(self, gpu: int) -> tuple[int, int]: ...
    def memory_used_mib(self, gpu: int) -> int: ...
    def compute_pids(self, gpu: int) -> list[int]: ...
    def device_holders(self, path: str) -> list[int]: ...
    def kill(self, pid: int, signal: str = "KILL") -> bool: ...
    def ask_file(self, pid: int, name: str) -> bool: ...
    def has_file(self, pid: int, name: str) -> bool: ...
    def checkpoint_hook(self, *, ask: bool) -> int | None: ...
    def admin(self, path: str, authorization: str | None, body: str = "{}") -> int: ...
    def restart_unit(self, unit: str) -> bool: ...
    def reset_gpu(self, gpu: int) -> str: ...
    def reboot(self) -> None: ...


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str = ""
    stderr: str = ""


_NO_DRIVER = CommandResult(9, stdout="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")


def interpret(node: ShellNode, command: str, stdin: str = "") -> CommandResult:
    """Run one command line against the node's state, as its shell would; `stdin` is what the
    client sent on the command's standard input."""
    try:
        words = shlex.split(command)
    except ValueError:
        return CommandResult(2, stderr="sh: 1: Syntax error: Unterminated quoted string\n")
    if not words:
        return CommandResult(0)
    if words[0] == "cat" and len(words) == 2 and (match := _PROC_FILE.match(words[1])):
        return _cat_proc(node, words[1], match.group(1), match.group(2))
    if words[0] == "kill" and len(words) >= 4 and words[1] == "-s" and words[2] in _SIGNALS:
        pids = words[3:]
        if all(w.isdigit() for w in pids):
            return _kill(node, words[2], [int(w) for w in pids])
    match words:
        case ["which", *tools]:
            # A simulated node has every tool the catalogue calls.
            return CommandResult(0, stdout="".join(f"/usr/bin/{tool}\n" for tool in tools))
        case ["command", "-v", tool]:
            return CommandResult(0, stdout=f"/usr/bin/{tool}\n")
        case ["dcgmi", "diag", "-r", level, "-j"] if level in ("1", "2"):
            return _dcgm_diag(node)
        case ["cat", path] if path == BOOT_ID:
            return CommandResult(0, stdout=f"{node.boot_id}\n")
        case ["nvidia-smi", *args]:
            return _nvidia_smi(node, args)
        case ["pgrep", "-f", "-a", "--", regex]:
            return _pgrep(node, regex)
        case ["sh", "-c", script, "gpumedic-log", path, size] if script == READ_SCRIPT and size.isdigit() and path.startswith("/"):
            return _read_log(node, path, int(size))
        case ["fuser", path] if (device := _DEVICE.match(path)):
            return _fuser(node, path, int(device.group(1)))
        case ["systemctl", "reboot"]:
            node.reboot()
            return CommandResult(0)
        case ["systemctl", "restart", unit]:
            if node.restart_unit(unit):
                return CommandResult(0)
            return CommandResult(5, stderr=f"Failed to restart {unit}: Unit {unit} not found.\n")
        case ["systemctl", "is-active", unit]:
            # Every unit the node has runs (a hung sampler's unit is active too: it hangs, it did not exit).
            return CommandResult(0, stdout="active\n") if unit in UNITS else CommandResult(3, stdout="inactive\n")
        case ["docker", "system", "df", "--format", "{{.Type}}={{.Reclaimable}}"]:
            lines = (f"{kind}={_size(node.machine.docker_reclaimable[kind])} (0%)" for kind in DOCKER_KINDS)
            return CommandResult(0, stdout="".join(f"{line}\n" for line in lines))
        case ["docker", kind, "prune", "--force"] if kind in _PRUNES:
            freed = node.machine.docker_prune(_PRUNES[kind])
            return CommandResult(0, stdout=f"Total reclaimed space: {_size(freed)}\n")
        case ["df", "--block-size=1", "--output=used", path] if path in node.machine.disks:
            return CommandResult(0, stdout=f"Used\n{node.machine.disks[path][1]}\n")
        case ["df", "--block-size=1", "--output=avail,target", *paths]:
            known = [p for p in paths if p in node.machine.disks]
            rows = "".join(f"{node.machine.disks[p][0] - node.machine.disks[p][1]} {p}\n" for p in known)
            missing = "".join(f"df: {p}: No such file or directory\n" for p in paths if p not in known)
            return CommandResult(1 if missing else 0, stdout=f" Avail Mounted on\n{rows}", stderr=missing)
        case ["touch", "--", path] if (cwd := _CWD_FILE.match(path)):
            if node.ask_file(int(cwd.group(1)), cwd.group(2)):
                return CommandResult(0)
            return CommandResult(1, stderr=f"touch: cannot touch '{path}': No such file or directory\n")
        case ["test", "-e", path] if (cwd := _CWD_FILE.match(path)):
            return CommandResult(0 if node.has_file(int(cwd.group(1)), cwd.group(2)) else 1)
        case ["grep", "MemAvailable:", "/proc/meminfo"]:
            return CommandResult(0, stdout=f"MemAvailable:   {node.machine.memory_available_kib} kB\n")
        case [*options, body, url] if options == _CURL and (loopback := _LOOPBACK_URL.match(url)):
            return _admin(node, loopback.group("path") or "/", stdin, body)
        case ["curl", "-sS", "-m", _, *method, "-o", "/dev/null", "-w", "%{http_code}", url] if (
                method in ([], ["-X", "POST"]) and (loopback := _LOOPBACK_URL.match(url))):
            return _hook(node, loopback, ask=bool(method))
    return CommandResult(127, stderr=f"sh: 1: {words[0]}: not found\n")


def _dcgm_diag(node: ShellNode) -> CommandResult:
    """`dcgmi diag -j` as DCGM 4.x prints it ("DCGM Diagnostic" > test_categories > tests > results,
    one per GPU): the memory test fails on a GPU with an uncorrectable error or a remap pending, every
    test on a GPU off the bus; dcgmi then exits non-zero, as it does."""

    def result(gpu, failed: bool, why: str) -> dict:
        entry = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu.index, "status": "Fail" if failed else "Pass"}
        return {**entry, "warnings": [{"error_category": 4, "error_id": 3, "error_severity": 2, "warning": why}]} if failed else entry

    memory = [result(g, g.lost or g.ecc_uncorrected > 0 or g.remapped_rows_pending,
                     f"GPU {g.index} has uncorrectable memory errors or a row remap pending") for g in node.gpus]
    software = [result(g, g.lost, f"GPU {g.index} is not accessible") for g in node.gpus]
    document = {"DCGM Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [{"name": "software", "results": software}]},
        {"category": "Hardware", "tests": [{"name": "memory", "results": memory}]},
    ]}, "version": "4.2.3"}
    failed = any(r["status"] == "Fail" for r in memory + software)
    return CommandResult(226 if failed else 0, stdout=json.dumps(document, indent=1) + "\n")


def _nvidia_smi(node: ShellNode, args: list[str]) -> CommandResult:
    if args == [_GPU_STATE, "--format=csv,noheader,nounits"]:
        return _gpu_state(node)
    if args == ["--query-compute-apps=pid", "--format=csv,noheader"]:
        return _all_apps(node)
    match args:
        case [query, "--format=csv,noheader,nounits", index] if query in _GPU_QUERIES and index.startswith("--id="):
            what = _GPU_QUERIES[query]
        case ["--query-compute-apps=pid", "--format=csv,noheader", index] if index.startswith("--id="):
            what = "apps"
        case ["--gpu-reset", "-i", index]:
            what = "reset"
        case _:
            return CommandResult(2, stdout=f"Invalid combination of input arguments: {' '.join(args)}\n")
    index = index.removeprefix("--id=")
    gpu = int(index) if index.isdigit() else -1
    if node.nvml_missing:
        return _NO_DRIVER
    if not 0 <= gpu < len(node.gpus):
        return CommandResult(6, stdout=f"No devices were found matching the id {index}\n")
    if what == "reset":
        complaint = node.reset_gpu(gpu)
        if complaint:
            return CommandResult(3, stdout=f"{complaint}\n")
        return CommandResult(0, stdout=f"GPU 00000000:{0x18 + gpu:02X}:00.0 was successfully reset.\n")
    if node.gpus[gpu].lost:
        return CommandResult(15, stdout="Unable to determine the device handle for GPU: GPU is lost.\n")
    if what == "utilization":
        return CommandResult(0, stdout=f"{node.utilization(gpu)[0]}\n")
    if what == "memory":
        return CommandResult(0, stdout=f"{node.memory_used_mib(gpu)}\n")
    return CommandResult(0, stdout="".join(f"{pid}\n" for pid in node.compute_pids(gpu)))


def _read_log(node: ShellNode, path: str, size: int) -> CommandResult:
    """The log read's script (`remediator.logs.READ_SCRIPT`): coreutils' `tail -c`, the last `size`
    bytes of a file of the node (under its run directory, its root), refused (exit 3) where the
    file is missing, a symlink or no regular file, or where a link on the way leads to another file."""
    root = getattr(node, "file_root", None)
    where = root / path.lstrip("/") if root is not None and ".." not in path.split("/") else None
    if where is None or where.is_symlink() or not where.is_file():
        return CommandResult(3, stderr="a symlink or no regular file: not read\n")
    if where.resolve() != root.resolve() / path.lstrip("/"):
        return CommandResult(3, stderr="a link on its way leads to another file: not read\n")
    with open(where, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - size))
        return CommandResult(0, stdout=f.read().decode("utf-8", "replace"))


def _pgrep(node: ShellNode, regex: str) -> CommandResult:
    """procps's `pgrep -f -a`: `PID COMMAND LINE` of each live process whose command line matches;
    exit 1 when none does, 2 for a pattern it cannot read."""
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        return CommandResult(2, stderr=f"pgrep: invalid regular expression: {exc}\n")
    lines = [f"{p.pid} {' '.join(p.argv)}\n" for p in node.live_processes() if pattern.search(" ".join(p.argv))]
    return CommandResult(0 if lines else 1, stdout="".join(lines))


def _all_apps(node: ShellNode) -> CommandResult:
    """Every GPU's compute processes, a pid per line (a lost GPU fails the whole query)."""
    if node.nvml_missing:
        return _NO_DRIVER
    if any(g.lost for g in node.gpus):
        return CommandResult(15, stdout="Unable to determine the device handle for GPU: GPU is lost.\n")
    return CommandResult(0, stdout="".join(f"{pid}\n" for gpu in range(len(node.gpus)) for pid in node.compute_pids(gpu)))


def _gpu_state(node: ShellNode) -> CommandResult:
    """Every GPU's index, utilisation, memory used and compute mode, one line each (pre-flight's query)."""
    if node.nvml_missing:
        return _NO_DRIVER
    lines = []
    for gpu in node.gpus:
        if gpu.lost:
            lines.append(f"{gpu.index}, [GPU requires reset], [GPU requires reset], [GPU requires reset]")
        else:
            mode = _COMPUTE_MODES.get(gpu.compute_mode, "[Unknown Error]")
            lines.append(f"{gpu.index}, {node.utilization(gpu.index)[0]}, {node.memory_used_mib(gpu.index)}, {mode}")
    return CommandResult(0, stdout="".join(f"{line}\n" for line in lines))


def _fuser(node: ShellNode, path: str, gpu: int) -> CommandResult:
    """Like psmisc's fuser: pids on stdout, the file name on stderr, exit 1 when nobody holds it."""
    if gpu >= len(node.gpus):
        return CommandResult(1, stderr=f"Cannot stat file {path}: No such file or directory\n")
    pids = node.device_holders(path)
    if not pids:
        return CommandResult(1)
    return CommandResult(0, stdout="".join(f" {pid}" for pid in pids), stderr=f"{path}:")


def _admin(node: ShellNode, path: str, stdin: str, body: str) -> CommandResult:
    """curl -f -w '%{http_code}': the status on stdout, and exit 22 with curl's words for 4xx/5xx."""
    headers = dict(line.split(": ", 1) for line in stdin.splitlines() if ": " in line)
    status = node.admin(path, headers.get("Authorization"), body)
    if status >= 400:
        return CommandResult(22, stdout=str(status), stderr=f"curl: (22) The requested URL returned error: {status}\n")
    return CommandResult(0, stdout=str(status))


def _hook(node: ShellNode, url: re.Match, *, ask: bool) -> CommandResult:
    """The jobs' checkpoint hook, as curl -sS -w '%{http_code}' shows it; none listening: curl's exit 7."""
    status = node.checkpoint_hook(ask=ask)
    if status is None:
        port = (url.group(2) or ":80")[1:]
        return CommandResult(7, stdout="000", stderr=f"curl: (7) Failed to connect to 127.0.0.1 port {port}: Connection refused\n")
    return CommandResult(0, stdout=str(status))


def _size(size: int) -> str:
    """Bytes the way docker prints them (decimal units)."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.4g}{unit}"
    return f"{size}B"


def _cat_proc(node: ShellNode, path: str, pid_word: str, name: str) -> CommandResult:
    p = node.process(int(pid_word)) if pid_word.isdigit() else None
    if p is None:
        return CommandResult(1, stderr=f"cat: {path}: No such file or directory\n")
    return CommandResult(0, stdout=p.proc_stat() if name == "stat" else p.proc_cmdline())


def _kill(node: ShellNode, signal: str, pids: list[int]) -> CommandResult:
    # like procps kill: every pid is tried; one that is missing makes the exit status 1
    missing = [pid for pid in pids if not node.kill(pid, signal)]
    stderr = "".join(f"kill: ({pid}) - No such process\n" for pid in missing)
    return CommandResult(1 if missing else 0, stderr=stderr)


class _Server(asyncssh.SSHServer):
    """Public-key authentication only; the authorized key is the fleet's, for any user."""

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False


class SshEndpoint:
    """One node's SSH server on loopback, with its own ed25519 host key."""

    def __init__(self, node: ShellNode, host_key: asyncssh.SSHKey) -> None:
        self.node = node
        self.host_key = host_key
        self.port: int | None = None
        self._server: asyncssh.SSHAcceptor | None = None
        self._silent: asyncio.Server | None = None
        self._held: set[asyncio.StreamWriter] = set()
        self._late: set[asyncio.Task] = set()

    async def start(self, client_public_key: asyncssh.SSHKey, host: str = "127.0.0.1") -> int:
        authorized = asyncssh.import_authorized_keys(client_public_key.export_public_key().decode())
        self._server = await asyncssh.create_server(
            _Server,
            host,
            0,
            server_host_keys=[self.host_key],
            authorized_client_keys=authorized,
            process_factory=self._handle,
            encoding="utf-8",
            allow_pty=False,
            allow_scp=False,
            agent_forwarding=False,
            x11_forwarding=False,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._silent is not None:
            self._silent.close()
            for writer in self._held:
                writer.close()
            self._held.clear()
            self._silent = None

    async def refuse(self) -> None:
        """sshd is down: the port refuses connections."""
        await self.stop()

    async def hang(self, host: str = "127.0.0.1") -> None:
        """sshd is wedged: the port accepts TCP but never says a word (no SSH banner)."""
        await self.stop()

        async def _hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._held.add(writer)

        self._silent = await asyncio.start_server(_hold, host, self.port, reuse_address=True)

    def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        command = process.command
        if command is None:
            process.stderr.write("interactive shells are not offered\n")
            process.exit(1)
            return
        self.node.ssh_commands.append(command)
        if command.startswith(CURL):  # http_admin's reads its headers from stdin first
            task = asyncio.get_running_loop().create_task(self._run_with_stdin(process, command))
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            return
        stall = self.node.ssh_stalls.get(command.split(" ", 1)[0])
        if stall:
            task = asyncio.get_running_loop().create_task(self._run_late(process, command, stall))
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            return
        self._answer(process, command)

    async def _run_late(self, process: asyncssh.SSHServerProcess, command: str, stall_s: float) -> None:
        """A hung command still runs in the end, as on a real node, whether or not the client waited."""
        await asyncio.sleep(stall_s)
        try:
            self._answer(process, command)
        except Exception:  # the client went away; the command ran all the same (as sshd's child would)
            log.debug("%s: client gone before %r answered", self.node.node_id, command)

    async def _run_with_stdin(self, process: asyncssh.SSHServerProcess, command: str) -> None:
        try:
            stdin = await asyncio.wait_for(process.stdin.read(), 5.0)
            self._answer(process, command, stdin)
        except Exception:  # the client went away or never closed stdin
            log.debug("%s: no stdin for %r", self.node.node_id, command)
            process.exit(2)

    def _answer(self, process: asyncssh.SSHServerProcess, command: str, stdin: str = "") -> None:
        result = interpret(self.node, command, stdin)
        log.debug("%s: %r -> exit %d", self.node.node_id, command, result.exit_status)
        if result.stdout:
            process.stdout.write(result.stdout)
        if result.stderr:
            process.stderr.write(result.stderr)
        process.exit(result.exit_status)
