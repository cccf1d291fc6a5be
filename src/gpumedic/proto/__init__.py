"""Generates `proto/`, the language-neutral contract, from the event models, and guards it.

Consumers in other languages code against `proto/`, never against Python, so it must say exactly
what the models say. One command regenerates it (`make proto`); `--check` regenerates in memory
and fails when the committed files drifted from the models (`make proto-check`, run by CI). The
same check compares every schema with the committed v1 baseline and fails on a change that
would break a v1 consumer or producer: within v1 the contract may only grow.

    gpumedic proto                              # regenerate proto/ (adds baselines for new events only)
    gpumedic proto --check                      # exit 1 on drift or on a breaking change
    gpumedic proto --accept-breaking            # also overwrite the v1 baseline (in practice: a v2)

Output is deterministic (sorted keys where order is free, a trailing newline, no timestamps),
so the check compares text with text. This module writes and checks; the pieces come from
`documents` (schemas, examples, the subjects catalogue, the README), `asyncapi` and `compat`
(what a v1 change may not do).
"""

from __future__ import annotations

import difflib
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpumedic.proto.asyncapi import asyncapi_document
from gpumedic.proto.compat import breaking_changes, catalogue_breaking_changes
from gpumedic.proto.documents import (
    CONSUMERS,
    OPEN_ENUMS,
    PRODUCERS,
    ContractError,
    event_schema,
    golden_example,
    published_schema,
    readme,
    subject_pattern,
    subjects_catalogue,
    subjects_markdown,
)
from gpumedic_events import EVENT_TYPES

log = logging.getLogger(__name__)

BASELINE_DIR = "baseline/v1"
_DIFF_LINES = 20


def _json(data: Any, *, sort_keys: bool = True) -> str:
    return json.dumps(data, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n"


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100, default_flow_style=False)


def current_schemas() -> dict[str, dict[str, Any]]:
    return {event.__name__: event_schema(event) for event in EVENT_TYPES}


def read_baselines(proto_dir: Path) -> dict[str, str]:
    """The committed baseline files, relative path -> text, exactly as they are on disk."""
    folder = proto_dir / BASELINE_DIR
    if not folder.is_dir():
        return {}
    return {f"{BASELINE_DIR}/{p.name}": p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.json"))}


def render(proto_dir: Path | None = None, *, accept_breaking: bool = False) -> dict[str, str]:
    """Every file proto/ should hold, relative path -> text.

    Existing baselines under `proto_dir` are kept verbatim (including those of events gone from
    the catalogue, so the compatibility check can name them); a new event gets its current schema
    as baseline. With `accept_breaking` the baseline is the current schemas, nothing else.
    """
    schemas = current_schemas()
    files: dict[str, str] = {
        "README.md": readme(),
        "subjects.json": _json(subjects_catalogue()),
        "subjects.md": subjects_markdown(),
        "asyncapi.yaml": _yaml(asyncapi_document()),
    }
    for event in EVENT_TYPES:
        name = event.__name__
        files[f"schemas/{name}.json"] = _json(published_schema(event))
        files[f"examples/{name}.json"] = _json(golden_example(event), sort_keys=False)
    baselines = {} if accept_breaking or proto_dir is None else read_baselines(proto_dir)
    for name, schema in schemas.items():
        baselines.setdefault(f"{BASELINE_DIR}/{name}.json", _json(schema))
    files.update(baselines)
    return dict(sorted(files.items()))


def _files_on_disk(proto_dir: Path) -> Iterator[str]:
    if proto_dir.is_dir():
        for path in sorted(proto_dir.rglob("*")):
            if path.is_file():
                yield path.relative_to(proto_dir).as_posix()


def drift(proto_dir: Path, expected: Mapping[str, str]) -> list[str]:
    """One entry per stale, missing or extra file, stale ones with a unified diff excerpt."""
    problems = []
    on_disk = set(_files_on_disk(proto_dir))
    for rel, text in expected.items():
        if rel not in on_disk:
            problems.append(f"missing: proto/{rel}")
            continue
        actual = (proto_dir / rel).read_text(encoding="utf-8")
        if actual != text:
            diff = list(
                difflib.unified_diff(
                    actual.splitlines(),
                    text.splitlines(),
                    f"proto/{rel} (committed)",
                    f"proto/{rel} (from the models)",
                    lineterm="",
                )
            )
            excerpt = "\n".join(f"    {line}" for line in diff[:_DIFF_LINES])
            more = f"\n    ... {len(diff) - _DIFF_LINES} more diff lines" if len(diff) > _DIFF_LINES else ""
            problems.append(f"stale: proto/{rel}\n{excerpt}{more}")
    problems.extend(f"extra: proto/{rel}" for rel in sorted(on_disk - set(expected)))
    return problems


def write(proto_dir: Path, expected: Mapping[str, str]) -> list[str]:
    """Make proto_dir hold exactly `expected`: write what changed, remove what is not generated."""
    changed = []
    for rel, text in expected.items():
        path = proto_dir / rel
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(rel)
        log.info("wrote proto/%s", rel)
    for rel in set(_files_on_disk(proto_dir)) - set(expected):
        (proto_dir / rel).unlink()
        changed.append(rel)
        log.info("removed proto/%s (not generated)", rel)
    for folder in sorted((p for p in proto_dir.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    return sorted(changed)


def compatibility_problems(proto_dir: Path) -> list[str]:
    """Breaking changes of the current models against the baseline committed in proto_dir."""
    baselines = {Path(rel).stem: json.loads(text) for rel, text in read_baselines(proto_dir).items()}
    return catalogue_breaking_changes(baselines, current_schemas())


def default_proto_dir(start: Path | None = None) -> Path:
    """The repository root's proto/: the nearest folder up from `start` (the cwd) with libs/events."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "libs" / "events").is_dir():
            return folder / "proto"
    return here / "proto"


def main(*, out: Path | None = None, check: bool = False, accept_breaking: bool = False) -> int:
    """`gpumedic proto`: regenerate proto/ (into `out`, default the repository's), or with `check`
    write nothing and exit 1 on drift or on a breaking change against the baseline;
    `accept_breaking` also overwrites the v1 compatibility baseline (in practice: cut a v2)."""
    if check and accept_breaking:
        print("gpumedic proto: --check and --accept-breaking exclude each other", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    proto_dir: Path = out if out is not None else default_proto_dir()
    try:
        expected = render(proto_dir, accept_breaking=accept_breaking)
    except ContractError as exc:
        print(f"cannot generate proto/: {exc}", file=sys.stderr)
        return 1
    if check:
        return _check(proto_dir, expected)
    changed = write(proto_dir, expected)
    print(f"proto/ regenerated in {proto_dir}: {len(changed)} file(s) changed")
    breaking = compatibility_problems(proto_dir)
    if breaking:
        _print_breaking(breaking)
        return 1
    return 0


def _check(proto_dir: Path, expected: Mapping[str, str]) -> int:
    problems = drift(proto_dir, expected)
    breaking = compatibility_problems(proto_dir)
    if problems:
        print(f"proto/ is stale ({len(problems)} file(s)); run `make proto` and commit the result:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    if breaking:
        _print_breaking(breaking)
    if problems or breaking:
        return 1
    print("proto/ is up to date")
    return 0


def _print_breaking(breaking: Sequence[str]) -> None:
    print(f"{len(breaking)} breaking change(s) against proto/{BASELINE_DIR}:", file=sys.stderr)
    for problem in breaking:
        print(f"  {problem}", file=sys.stderr)
    print("  v1 may only grow; a breaking change needs a v2 (see proto/README.md)", file=sys.stderr)


__all__ = [
    "CONSUMERS", "OPEN_ENUMS", "PRODUCERS", "breaking_changes", "catalogue_breaking_changes", "compatibility_problems",
    "current_schemas", "default_proto_dir", "drift", "event_schema", "main", "render", "subject_pattern", "write",
]
