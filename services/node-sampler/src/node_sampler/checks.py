"""The operator's own checks: a directory of scripts, run on the node like node-problem-detector's
custom plugins (and LBNL NHC's checks), each result a fact in every sample.

The contract is node-problem-detector's: exit 0 ok, 1 a problem, anything else unknown (2, a
timeout, a script that cannot run); the first line printed on standard output says why. Every
executable regular file in the directory named NAME or NAME.EXT is a check called NAME (a README
is not executable; `x.sh.bak` and hidden files are not checks); at most `MAX_CHECKS`, in name
order, and of two with one NAME only the first. They run one after another every `interval_s`, in the
background, so a sample never waits for a script; each gets `timeout_s`, after which its whole
process group is killed.

A script runs with the sampler's privileges, so one that someone else could have changed is not
run: the script and the directory must belong to root or to the sampler's user and be writable
by no one else. Scripts get no input, a plain environment (PATH, LANG, and GPUMEDIC_NODE_ROOT:
where the node's file system is, `/host` for a sampler in a container) and at most
`MAX_OUTPUT` bytes of their output are read; the message is masked before it leaves the node.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import stat
from datetime import UTC, datetime
from pathlib import Path

from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import CheckFact
from gpumedic_events.redact import redact
from gpumedic_events.node import CHECK_NAME

log = logging.getLogger(__name__)

MAX_CHECKS = 64
MAX_OUTPUT = 4096
MAX_MESSAGE = 256
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
SCRIPT_NAME = re.compile(CHECK_NAME.removesuffix("$") + r"(\.[A-Za-z0-9]{1,8})?$")


class CheckScripts:
    """The checks in `directory`, run every `interval_s` with `timeout_s` each; `root` is where the
    node's file system is mounted for the sampler (told to the scripts as GPUMEDIC_NODE_ROOT)."""

    def __init__(self, directory: Path, *, interval_s: float = 60.0, timeout_s: float = 10.0, root: Path = Path("/")) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("a check's interval and timeout are positive")
        self.directory = directory
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.root = root
        self.results: dict[str, CheckFact] = {}
        self._runner: asyncio.Task | None = None
        self._said: set[str] = set()

    def observe(self) -> tuple[CheckFact, ...]:
        """Each check's last result; the first call starts running them."""
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run_forever(), name="node-checks")
        return tuple(self.results[name] for name in sorted(self.results))

    async def close(self) -> None:
        if self._runner is not None:
            await stop_tasks([self._runner])

    async def _run_forever(self) -> None:
        while True:
            await self.run_once()
            await asyncio.sleep(self.interval_s)

    async def run_once(self) -> None:
        """Run every check once, one after another; a check no longer there is forgotten."""
        scripts = self._scripts()
        for name in set(self.results) - set(scripts):
            del self.results[name]
        for name, path in scripts.items():
            status, message = self._refusal(path) or await self._run(path)
            self.results[name] = CheckFact(name=name, status=status, message=message, ran_at=datetime.now(UTC))

    def _scripts(self) -> dict[str, Path]:
        """The checks by name, in name order."""
        try:
            entries = sorted(self.directory.iterdir())
        except OSError as exc:
            self._say_once("dir", "the checks directory %s cannot be read: %s", self.directory, exc.strerror or exc)
            return {}
        scripts: dict[str, Path] = {}
        for path in entries:
            if not SCRIPT_NAME.fullmatch(path.name):
                continue  # a hidden file, a backup (x.sh.bak, x.sh~)
            try:
                info = path.stat()
            except OSError:
                continue
            if not (stat.S_ISREG(info.st_mode) and info.st_mode & 0o111):
                continue
            name = path.name.split(".", 1)[0]
            if name in scripts:
                self._say_once(name, "%s and %s are both the check %s: only the first runs", scripts[name].name, path.name, name)
            elif len(scripts) == MAX_CHECKS:
                self._say_once("many", "more than %d checks in %s; only the first %d by name run", MAX_CHECKS, self.directory, MAX_CHECKS)
            else:
                scripts[name] = path
        return scripts

    def _refusal(self, path: Path) -> tuple[str, str] | None:
        """('unknown', why) when the script is not safe to run as the sampler's user."""
        for what, where in (("the checks directory", self.directory), ("the script", path)):
            try:
                info = where.stat()
            except OSError as exc:
                return "unknown", f"not run: {what} cannot be read: {exc.strerror or exc}"
            if info.st_uid not in (0, os.geteuid()):
                return "unknown", f"not run: {what} belongs to uid {info.st_uid}, not root or the sampler's user"
            if info.st_mode & 0o022:
                return "unknown", f"not run: {what} is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
        return None

    async def _run(self, path: Path) -> tuple[str, str]:
        try:
            process = await asyncio.create_subprocess_exec(
                str(path), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                cwd=self.directory, start_new_session=True,
                env={"PATH": PATH, "LANG": "C.UTF-8", "GPUMEDIC_NODE_ROOT": str(self.root)},
            )
        except OSError as exc:
            return "unknown", f"cannot run: {exc.strerror or exc}"
        try:
            async with asyncio.timeout(self.timeout_s):
                output = await _bounded(process.stdout)
                code = await process.wait()
        except TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            return "unknown", f"timed out after {self.timeout_s:g}s"
        finally:
            _kill_group(process.pid)  # what it left running in the background
        message = first_line(output)
        if code == 0:
            return "ok", message
        if code == 1:
            return "problem", message
        said = f"exit {code}" if code >= 0 else f"killed by signal {-code}"
        return "unknown", f"{said}: {message}"[:MAX_MESSAGE] if message else said

    def _say_once(self, key: str, text: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(text, *args)


async def _bounded(stream: asyncio.StreamReader | None) -> bytes:
    """The first MAX_OUTPUT bytes of `stream`; the rest is read and dropped, so the script never blocks on a full pipe."""
    kept = bytearray()
    while stream is not None and (chunk := await stream.read(65536)):
        kept += chunk[: MAX_OUTPUT - len(kept)]
    return bytes(kept)


def first_line(output: bytes) -> str:
    """The first line that says something, as text a person can read: no control characters, masked, at most MAX_MESSAGE."""
    for line in output.decode("utf-8", "replace").splitlines():
        if text := _CONTROL.sub("", line).strip():
            return redact(text)[:MAX_MESSAGE]
    return ""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:  # the group is gone already
        pass
