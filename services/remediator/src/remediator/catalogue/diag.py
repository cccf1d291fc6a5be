"""DCGM's active diagnostics (`dcgmi diag -r 1|2 -j`), run on a drained node before it returns
(`actions.undrain_node.dcgm_diag`) and by `gpumedic preflight --deep`.

Level 1 takes about a minute (deployment and software checks), level 2 a few (plus a short PCIe
and memory test); both load the GPUs, so they run only where no job does. A node without DCGM
(`command -v dcgmi` finds nothing) is said in one line and the rest of the validation stands.

`dcgmi diag -j` prints one JSON document in one of two shapes, both read here:
- DCGM 3.x: `{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"gpu_ids": "0" or "0,1,...", "status": "Pass|Fail|Warn|Skip", "warnings":
  [text]}]}]}]}}` (NVVS's JsonOutput);
- DCGM 4.x: `{"DCGM Diagnostic": {"test_categories": [... "results": [{"entity_group": "GPU",
  "entity_id": 0, "status": "Fail", "warnings": [{"warning": text, "error_id": n}]}]}]}, ...}`.
Statuses are compared without case (3.x wrote PASS and Pass over its releases). dcgmi may print a
line before the document, and exits non-zero when a test fails: the document decides, not the
exit status; no document at all is a failure to run, which says what dcgmi printed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from remediator.catalogue.base import Node, said

FIND = "command -v dcgmi"
LEVELS = (1, 2)
MAX_PROBLEMS = 8


def command(level: int) -> str:
    if level not in LEVELS:
        raise ValueError(f"DCGM diagnostics level {level!r} is not one of {LEVELS}")
    return f"dcgmi diag -r {level} -j"


@dataclass(frozen=True)
class Verdict:
    """What the diagnostics said: `ran` False when the node has no DCGM; `passed` only if it ran."""

    ran: bool
    passed: bool
    summary: str


async def run(node: Node, level: int, timeout_s: float) -> Verdict:
    """Find dcgmi, run the level, read its JSON. Raises only what the node's runner raises."""
    found = await node.run(FIND)
    if found.exit_status != 0 or not found.stdout.strip():
        return Verdict(False, False, "DCGM diagnostics skipped: no dcgmi on the node")
    result = await node.run(command(level), timeout_s=timeout_s)
    verdict = parse(result.stdout)
    if verdict is None:
        return Verdict(True, False, f"dcgmi diag -r {level} gave no diagnostic document ({said(result)})")
    return Verdict(True, not verdict, _summary(level, verdict))


def parse(text: str) -> list[str] | None:
    """The problems a `dcgmi diag -j` document reports (a failed or warning test, per GPU), [] when
    every test passed or was skipped; None when there is no document with tests in `text`."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        document = json.loads(text[start : end + 1])
    except (ValueError, RecursionError):
        return None
    root = document.get("DCGM Diagnostic", document.get("DCGM GPU Diagnostic")) if isinstance(document, dict) else None
    categories = root.get("test_categories") if isinstance(root, dict) else None
    if not isinstance(categories, list):
        return None
    problems: list[str] = []
    tests = 0
    for category in categories:
        for test in (category.get("tests") or []) if isinstance(category, dict) else []:
            if not isinstance(test, dict):
                continue  # DCGM 3.x leaves nulls between tests
            tests += 1
            for result in test.get("results") or []:
                if not isinstance(result, dict):
                    continue
                status = str(result.get("status", "")).strip().lower()
                if status in ("fail", "warn"):
                    problems.append(f"{test.get('name', '?')} {status} on {_where(result)}{_first_warning(result)}")
    return problems if tests else None


def _where(result: dict) -> str:
    if "entity_id" in result:
        return f"{str(result.get('entity_group', 'GPU'))} {result['entity_id']}"
    return f"GPU {result.get('gpu_ids', '?')}"


def _first_warning(result: dict) -> str:
    warnings = result.get("warnings") or []
    first = warnings[0] if isinstance(warnings, list) and warnings else None
    text = first.get("warning") if isinstance(first, dict) else first
    return f": {str(text)[:160]}" if text else ""


def _summary(level: int, problems: list[str]) -> str:
    if not problems:
        return f"DCGM diagnostics level {level} passed"
    shown = "; ".join(problems[:MAX_PROBLEMS]) + (f"; and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else "")
    return f"DCGM diagnostics level {level} failed: {shown}"
