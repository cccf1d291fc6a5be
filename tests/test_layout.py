"""The layout's rules, checked: libs are imported and services are run. Only the simulated fleet
(`sim/`, the one composer of services), the tests and the benchmarks import services; no service
imports another; no lib imports a service, the CLI or the simulated fleet; the operator's CLI
imports neither a service nor the simulated fleet (which adds its commands through an entry
point); no package imports itself in a circle, nor stacks its modules deeper than its floors.
node-sampler (on every GPU node) installs without a database or SSH stack."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICE_PACKAGES = {p.name: p for p in ROOT.glob("services/*/src/*") if p.is_dir()}
LIB_PACKAGES = {p.name: p for p in ROOT.glob("libs/*/src/*") if p.is_dir()}
CLI = ROOT / "src" / "gpumedic"
SIM = ROOT / "sim" / "src" / "gpumedic_sim"


def _imported_top_levels(package: Path) -> set[str]:
    names = set()
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_imports_run_one_way_sim_then_cli_then_services_then_libs():
    assert len(SERVICE_PACKAGES) == 6 and SIM.is_dir() and CLI.is_dir()
    services, composers = set(SERVICE_PACKAGES), {CLI.name, SIM.name}
    wrong = {}
    for name, package in SERVICE_PACKAGES.items():
        wrong[name] = _imported_top_levels(package) & ((services - {name}) | composers)
    for name, lib in LIB_PACKAGES.items():
        wrong[name] = _imported_top_levels(lib) & (services | composers)
    wrong[CLI.name] = _imported_top_levels(CLI) & (services | {SIM.name})
    assert not {name: found for name, found in wrong.items() if found}
    assert _imported_top_levels(SIM) & services  # it is where services are composed


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
    # nor RE2 (a node matches no silence, and its wheels need glibc 2.27 where a node's artifact supports 2.17)
    assert "google-re2" not in needs and "google-re2" in _optional(lock, "gpumedic-events")


def _optional(lock: dict, name: str) -> set[str]:
    package = next(p for p in lock["package"] if p["name"] == name)
    return {d["name"] for extra in package.get("optional-dependencies", {}).values() for d in extra}


def _module_name(root: Path, source: Path) -> str:
    parts = source.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.Module, *, typing_too: bool = False) -> list[ast.ImportFrom | ast.Import]:
    """Every import that runs, inside functions too (a circle dodged by a late import is still one);
    not those under `if TYPE_CHECKING:`, which never run, unless `typing_too`."""
    skipped = set() if typing_too else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for inner in node.body for n in ast.walk(inner)
    }
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in skipped]


def _import_graph(package: Path, *, typing_too: bool = False) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (a package's __init__ runs before any
    of its modules anyway, so importing the package itself is no edge)."""
    root = package.parent
    modules = {_module_name(root, s): s for s in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, source in modules.items():
        targets = set()
        for node in _runtime_imports(ast.parse(source.read_text()), typing_too=typing_too):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif node.module and node.level == 0:
                targets |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        package_itself = {name.rsplit(".", i)[0] for i in range(name.count(".") + 1)} - {name}
        graph[name] = {t for t in targets if t in modules and t != name and t not in package_itself and not source.name == "__init__.py"}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    circles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            circles.append([*path[path.index(module):], module])
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return circles


def test_no_package_imports_itself_in_a_circle():
    packages = [*LIB_PACKAGES.values(), *SERVICE_PACKAGES.values(), CLI, SIM]
    found = {p.name: _circles(_import_graph(p)) for p in packages if p.is_dir()}
    assert not {name: circles for name, circles in found.items() if circles}


SIM_WINGS = ("faults", "machine", "fleet", "runs", "commands")
"""The simulated fleet's wings, bottom up: the fault table, what a node answers, the fleet, the
scripted and scored runs, the command entry. Each imports only those below it."""


def _wing(module: str) -> str:
    return module.split(".")[1]


def test_the_sims_wings_import_only_downwards_and_only_runs_use_the_clis_stack():
    graph = _import_graph(SIM, typing_too=True)
    modules = [m for m in graph if m != SIM.name]
    assert {_wing(m) for m in modules} == set(SIM_WINGS)
    upwards = sorted((m, t) for m in modules for t in graph[m] if SIM_WINGS.index(_wing(t)) > SIM_WINGS.index(_wing(m)))
    assert upwards == []
    assert _circles(graph) == []  # type-only imports included
    stack_users = set()
    for source in SIM.rglob("*.py"):
        for node in _runtime_imports(ast.parse(source.read_text()), typing_too=True):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n.startswith(("gpumedic.stack", "gpumedic.cli")) for n in names):
                stack_users.add(_module_name(SIM.parent, source))
    assert stack_users and {_wing(m) for m in stack_users} <= {"runs", "commands"}


def _deepest(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports in a package (it has no circle): its floors, top down."""
    @functools.cache
    def down(module: str) -> tuple[str, ...]:
        return max(((module, *down(t)) for t in graph[module]), key=len, default=(module,))

    return list(max((down(m) for m in graph), key=len))


FLOORS = {SIM: 6, CLI: 5, **dict.fromkeys(SERVICE_PACKAGES.values(), 7), **dict.fromkeys(LIB_PACKAGES.values(), 5)}
"""How deep each package may stack its modules, type-only and late imports counted: a newcomer
reads a module's floors below it to know what it stands on."""


@pytest.mark.parametrize("package", sorted(FLOORS), ids=lambda p: p.name)
def test_no_package_stacks_its_modules_deeper_than_its_floors(package):
    chain = _deepest(_import_graph(package, typing_too=True))
    assert len(chain) <= FLOORS[package], " -> ".join(chain)
