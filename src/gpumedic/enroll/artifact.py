"""The one file `gpumedic enroll` puts on a node: node-sampler, everything it imports, and a
process supervisor, built for the node's CPU, Python and C library from the versions uv.lock
pinned here.

It is a wheelhouse installed with pip's documented cross-platform install (`pip install --target
--platform ... --only-binary=:all:`): only wheels, so the node needs no compiler and never reaches
a package registry, and no venv, so a bare `python3` (no python3-venv, no pip) runs it. The
tarball holds `site/` (the packages), `VERSION`, and the node's control files. Artifacts are kept
under the cache directory by their content key: a fleet of one platform builds one, once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

NODE_FILES = Path(__file__).parent / "node"
WORKSPACE_PACKAGES = ("gpumedic-node-sampler", "gpumedic-bus", "gpumedic-events", "gpumedic-telemetry")
"""node-sampler and the workspace libraries it imports, built from this checkout."""
CARRIED = ("supervisor",)
"""Also in the artifact: the supervisor for nodes without systemd (its version pinned by uv.lock)."""
MIN_PYTHON = (3, 11)
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


class ArtifactError(Exception):
    """The artifact cannot be built for this platform; the message says why and what to do."""


@dataclass(frozen=True)
class Platform:
    """What decides which wheels a node can load."""

    arch: str
    """uname -m, normalised: x86_64 or aarch64."""
    python: tuple[int, int]
    glibc: tuple[int, int]

    @classmethod
    def of(cls, machine: str, python: str, libc: str) -> Platform:
        """From what the node printed: `uname -m`, "3.11", "glibc-2.36"; ArtifactError if no wheel fits."""
        arch = ARCHES.get(machine.strip())
        if arch is None:
            raise ArtifactError(f"CPU {machine.strip()[:40] or '(unknown)'}: wheels exist for x86_64 and aarch64 only")
        try:
            major, minor = (int(part) for part in python.strip().split(".")[:2])
        except ValueError:
            raise ArtifactError(f"python3 printed {python.strip()[:40]!r} as its version") from None
        if (major, minor) < MIN_PYTHON:
            raise ArtifactError(f"python3 is {major}.{minor}; node-sampler needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer")
        name, _, version = libc.strip().partition("-")
        found = re.match(r"^(\d+)\.(\d+)", version)
        if name != "glibc" or not found:
            raise ArtifactError(f"C library {libc.strip()[:40] or '(unknown)'}: the wheels need glibc (musl systems such as Alpine are not supported)")
        glibc = (int(found[1]), int(found[2]))
        if glibc < (2, 17):
            raise ArtifactError(f"glibc {glibc[0]}.{glibc[1]} is older than 2.17, the oldest the wheels support")
        return cls(arch, (major, minor), glibc)

    @property
    def tag(self) -> str:
        return f"cp{self.python[0]}{self.python[1]}-{self.arch}-glibc{self.glibc[0]}.{self.glibc[1]}"

    def pip_options(self) -> list[str]:
        """pip's options for this platform: every manylinux level the node's glibc can load."""
        platforms = [f"manylinux_2_{minor}_{self.arch}" for minor in range(self.glibc[1], 16, -1)]
        platforms.append(f"manylinux2014_{self.arch}")
        py = f"{self.python[0]}{self.python[1]}"
        options = ["--only-binary=:all:", "--implementation", "cp", "--python-version", f"{self.python[0]}.{self.python[1]}",
                   "--abi", f"cp{py}", "--abi", "abi3", "--abi", "none"]
        for platform in platforms:
            options += ["--platform", platform]
        return options


def _source_dir(distribution: str) -> Path:
    """The checkout directory an editable (workspace) install of `distribution` points at."""
    try:
        direct = importlib.metadata.distribution(distribution).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        direct = None
    info = json.loads(direct) if direct else {}
    url = info.get("url", "")
    if not info.get("dir_info", {}).get("editable") or not url.startswith("file://"):
        raise ArtifactError(
            f"{distribution} is not installed from a source checkout, so enroll cannot build the node's artifact here; "
            "run enroll from a checkout (make install), or pass --artifact with one built there"
        )
    return Path(url.removeprefix("file://"))


def _pins() -> str:
    """name==version of every installed distribution but the workspace's own: uv.lock's versions."""
    pins = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        direct = dist.read_text("direct_url.json")
        if not name or (direct and '"editable":true' in direct.replace(" ", "")):
            continue
        pins.add(f"{name}=={dist.version}")
    return "\n".join(sorted(pins, key=str.lower)) + "\n"


def _sources_digest(directories: list[Path]) -> str:
    digest = hashlib.sha256()
    for directory in directories:
        for path in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(directory.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def artifact_key(*, label: str = "") -> str:
    """The artifact's version: the sampler's own, then a digest of its sources, the pins, the
    node files and `label` (so an upgrade is any change of what would run on the node)."""
    sources = [_source_dir(name) for name in WORKSPACE_PACKAGES]
    digest = hashlib.sha256("\n".join([_sources_digest([*sources, NODE_FILES]), _pins(), label]).encode()).hexdigest()
    return f"{importlib.metadata.version('gpumedic-node-sampler')}+{digest[:12]}"


def _pip(*args: str, cwd: Path) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip() and "is ignored" not in line]
        raise ArtifactError(f"pip {args[0]} failed: " + " / ".join(lines[-4:])[:900])


def build_artifact(platform: Platform, cache: Path, *, label: str = "") -> tuple[Path, str]:
    """(path, version) of the artifact for `platform`, built into `cache` unless already there."""
    version = artifact_key(label=label)
    path = cache / f"gpumedic-node-{version.replace('+', '-')}-{platform.tag}.tar.gz"
    if path.exists():
        return path, version
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpumedic-artifact-") as tmp:
        work = Path(tmp)
        wheels, site = work / "wheels", work / "site"
        _pip("wheel", "--no-deps", "--wheel-dir", str(wheels), *(str(_source_dir(n)) for n in WORKSPACE_PACKAGES), cwd=work)
        (work / "pins.txt").write_text(_pins())
        ours = sorted(str(p) for p in wheels.glob("*.whl"))
        _pip("install", "--target", str(site), "--no-compile", "--no-warn-script-location", "--find-links", str(wheels),
             "--constraint", "pins.txt", *platform.pip_options(), *ours, *CARRIED, cwd=work)
        shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts name this machine's python
        partial = path.with_suffix(".part")
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(site, arcname="site")
            _add_bytes(tar, "VERSION", f"{version}\n".encode())
        partial.rename(path)
    return path, version


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def artifact_version(path: Path) -> str:
    """The VERSION inside an artifact (one given with --artifact); ArtifactError if it has none."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            member = tar.extractfile("VERSION")
            if member is None:
                raise KeyError("VERSION")
            return member.read().decode().strip()
    except (OSError, tarfile.TarError, KeyError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is not a gpumedic node artifact ({type(exc).__name__}: {exc})") from None
