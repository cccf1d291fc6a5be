"""The layout's rules, checked: libs are imported and services are run, so no service imports
another service; node-sampler (on every GPU node) installs without a database or SSH stack."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICE_PACKAGES = {p.name: p for p in ROOT.glob("services/*/src/*") if p.is_dir()}


def _imported_top_levels(package: Path) -> set[str]:
    names = set()
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_no_service_imports_another_service_and_no_lib_imports_a_service():
    assert len(SERVICE_PACKAGES) == 6
    for name, package in SERVICE_PACKAGES.items():
        assert not (_imported_top_levels(package) & (set(SERVICE_PACKAGES) - {name})), name
    for lib in ROOT.glob("libs/*/src/*"):
        assert not (_imported_top_levels(lib) & set(SERVICE_PACKAGES)), lib.name


def _closure(lock: dict, name: str) -> set[str]:
    packages = {p["name"]: p for p in lock["package"]}
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo += [d["name"] for d in packages[current].get("dependencies", [])]
    return seen


def test_node_sampler_installs_without_a_database_or_ssh():
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    needs = _closure(lock, "gpumedic-node-sampler")
    assert "nvidia-ml-py" in needs and "faststream" in needs
    assert not needs & {"sqlalchemy", "asyncssh", "alembic", "asyncpg", "aiosqlite", "gpumedic-store"}
