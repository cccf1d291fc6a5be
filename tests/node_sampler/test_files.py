"""The files a node must have, on this machine's real filesystem: present or not, size, and the
SHA-256 read in the background once per change (never per sample)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from node_sampler.files import ExpectedFiles


async def settled(files: ExpectedFiles):
    """The next look after the background read (if one was started) finished."""
    first = files.observe()
    for _ in range(200):
        if files._reading is None:
            break
        await asyncio.sleep(0.01)
    return first, files.observe()


async def test_a_file_is_hashed_once_per_change_and_a_missing_or_odd_one_says_so(tmp_path):
    model = tmp_path / "selfplay-v7.safetensors"
    model.write_bytes(b"weights" * 400_000)  # 2.8 MB: more than one read chunk
    odd = tmp_path / "a-directory"
    odd.mkdir()
    files = ExpectedFiles([model, tmp_path / "missing.bin", odd])
    first, then = await settled(files)
    assert (first[0].present, first[0].sha256) == (True, None)  # the sample does not wait for the read
    assert then[0].sha256 == hashlib.sha256(model.read_bytes()).hexdigest() and then[0].size == 2_800_000
    assert (then[1].present, then[1].sha256) == (False, None)
    assert (then[2].present, then[2].error) == (None, "is not a regular file")
    reads = []
    files._read = lambda *a: reads.append(a)  # type: ignore[method-assign]  # an unchanged file is not read again
    assert files.observe()[0].sha256 == then[0].sha256 and reads == []
    del files._read
    model.write_bytes(b"other weights")
    os.utime(model, ns=(1, 1))
    first, then = await settled(files)
    assert first[0].sha256 is None and then[0].sha256 == hashlib.sha256(b"other weights").hexdigest()
    await files.close()


async def test_files_are_read_under_the_node_root_and_named_as_the_node_names_them(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "v7.bin").write_bytes(b"w")  # a container's view of the host, mounted at tmp_path
    files = ExpectedFiles([Path("/models/v7.bin"), Path("/models/v8.bin")], root=tmp_path)
    _, (v7, v8) = await settled(files)
    assert (v7.path, v7.present, v7.sha256) == ("/models/v7.bin", True, hashlib.sha256(b"w").hexdigest())
    assert (v8.path, v8.present) == ("/models/v8.bin", False)
    await files.close()


def test_an_expected_file_is_named_by_an_absolute_path():
    with pytest.raises(ValueError, match="absolute path"):
        ExpectedFiles([Path("models/x.bin")])
