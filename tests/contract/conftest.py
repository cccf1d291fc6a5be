"""Where the committed contract lives, for every contract test."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumedic.proto import default_proto_dir


@pytest.fixture(scope="session")
def proto_dir() -> Path:
    return default_proto_dir(Path(__file__).parent)
