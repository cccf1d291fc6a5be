"""The fake NVML C library, built once per session and installed under the real pynvml per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from node_sampler.nvml import XidWatcher

from tests.node_sampler.fake_nvml import BuildError, FakeNvmlLib, build


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory) -> Path:
    """libnvidia-ml.so.1 compiled from fake_nvml.c. Fails (never skips) without gcc: CI has it."""
    try:
        return build(tmp_path_factory.mktemp("fake_nvml"))
    except BuildError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def fake_nvml(fake_nvml_library, monkeypatch) -> Iterator[FakeNvmlLib]:
    """The fake, reset, as the library the real pynvml calls; pynvml's module state (the loaded
    library, its cache of function pointers, the init refcount) is put back afterwards, so the
    tests that expect no NVML at all still see none."""
    lib = FakeNvmlLib(fake_nvml_library)
    lib.reset()
    monkeypatch.setattr(pynvml, "nvmlLib", lib.cdll)
    # pynvml caches function pointers by name across libraries: a fresh cache for this one
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    yield lib
    lib.reset()


@pytest.fixture
def watchers() -> Iterator[list[XidWatcher]]:
    """XID watchers a test starts; each is stopped when the test ends."""
    started: list[XidWatcher] = []
    yield started
    for watcher in started:
        watcher.stop()

