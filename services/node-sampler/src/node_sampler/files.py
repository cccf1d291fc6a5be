"""The files every node must have (runbook 002: "canonical models not synced to all nodes").

Each sample says, per expected file, whether it is there as a regular file, its size, and its
SHA-256 once read. A file is read again only when its size or modification time changed, one
file at a time in a worker thread, so a 20 GB model costs one read per change, never one per
sample, and a sample never waits for it. The detector compares the digests across the fleet.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from pathlib import Path

from gpumedic_events import FileFact

MAX_FILES = 64
CHUNK = 1 << 20


class ExpectedFiles:
    """`paths` as the node names them, read under `root` (where the node's file system is mounted for
    the sampler: / on the host, /host in a container that mounts it there)."""

    def __init__(self, paths: list[Path], root: Path = Path("/")) -> None:
        if len(paths) > MAX_FILES:
            raise ValueError(f"at most {MAX_FILES} expected files, not {len(paths)}")
        for path in paths:
            if not path.is_absolute():
                raise ValueError(f"an expected file is named by an absolute path, not {str(path)!r}")
        self.paths = list(dict.fromkeys(paths))
        self.root = root
        self._digests: dict[Path, tuple[tuple[int, int], str]] = {}
        """path -> ((size, mtime_ns) when read, its SHA-256)."""
        self._reading: asyncio.Task | None = None

    def observe(self) -> tuple[FileFact, ...]:
        """Each file as it is now; starts reading the first one whose digest is missing or old."""
        facts = []
        for path in self.paths:
            try:
                info = (self.root / path.relative_to("/")).stat()
            except FileNotFoundError:
                facts.append(FileFact(path=str(path), present=False))
                continue
            except OSError as exc:
                facts.append(FileFact(path=str(path), present=None, error=f"cannot be read: {exc.strerror or exc}"[:300]))
                continue
            if not stat.S_ISREG(info.st_mode):
                facts.append(FileFact(path=str(path), present=None, error="is not a regular file"))
                continue
            seen = (info.st_size, info.st_mtime_ns)
            known = self._digests.get(path)
            digest = known[1] if known is not None and known[0] == seen else None
            if digest is None and self._reading is None:
                self._reading = asyncio.get_running_loop().create_task(self._read(path, seen))
            facts.append(FileFact(path=str(path), present=True, size=info.st_size, sha256=digest))
        return tuple(facts)

    async def _read(self, path: Path, seen: tuple[int, int]) -> None:
        try:
            digest = await asyncio.to_thread(_sha256, self.root / path.relative_to("/"))
            self._digests[path] = (seen, digest)
        except OSError:
            self._digests.pop(path, None)  # said by the next look: gone, or unreadable
        finally:
            self._reading = None

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
