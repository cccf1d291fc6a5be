"""DCGM's diagnostics: both shapes of `dcgmi diag -j` read (fixtures written from NVIDIA's own
descriptions), a node without DCGM said in one line, a failing run a failed verdict. Over real SSH
against a simulated node: tests/sim/test_operations.py."""

from __future__ import annotations

import json
from pathlib import Path

from remediator.catalogue import diag
from remediator.catalogue.base import CommandResult, Node

FIXTURES = Path(__file__).parents[1] / "fixtures" / "dcgm"


def test_a_dcgm_3_document_names_the_failed_test_and_gpu_and_skips_its_nulls():
    problems = diag.parse((FIXTURES / "diag-3x-fail.txt").read_text())
    assert problems == ["GPU Memory fail on GPU 1: Error using CUDA API cudaMalloc for GPU 1"]


def test_a_dcgm_4_document_names_the_failed_test_on_its_entity_and_ignores_a_skip():
    problems = diag.parse((FIXTURES / "diag-4x-fail.json").read_text())
    assert problems == ["memory fail on GPU 0: Pending page retirements detected on GPU 0. Reset the GPU."]


def test_a_passing_document_has_no_problem_and_anything_else_is_no_document():
    passing = json.loads((FIXTURES / "diag-4x-fail.json").read_text())
    for category in passing["DCGM Diagnostic"]["test_categories"]:
        for test in category["tests"]:
            for result in test["results"]:
                result["status"] = "Pass"
                result.pop("warnings", None)
    assert diag.parse(json.dumps(passing)) == []
    for text in ("", "Error: unable to connect to host engine", "{not json}", '{"DCGM Diagnostic": {"version": "4.2.3"}}', "[1, 2]"):
        assert diag.parse(text) is None, text


def _node(answers: dict[str, CommandResult]) -> tuple[Node, list]:
    asked = []

    async def run(command: str, **extra) -> CommandResult:
        asked.append((command, extra))
        return answers.get(command, CommandResult(127, "", "not found"))

    async def sleep(_: float) -> None: ...

    return Node(run, 1.0, sleep, lambda: 0.0), asked


async def test_a_node_without_dcgm_is_one_line_and_a_failing_run_is_a_failed_verdict():
    node, asked = _node({})
    verdict = await diag.run(node, 1, 300)
    assert (verdict.ran, verdict.summary) == (False, "DCGM diagnostics skipped: no dcgmi on the node") and len(asked) == 1
    failing = (FIXTURES / "diag-4x-fail.json").read_text()
    node, asked = _node({"command -v dcgmi": CommandResult(0, "/usr/bin/dcgmi\n", ""), "dcgmi diag -r 2 -j": CommandResult(226, failing, "")})
    verdict = await diag.run(node, 2, 600)
    assert verdict.ran and not verdict.passed and verdict.summary.startswith("DCGM diagnostics level 2 failed: memory fail on GPU 0")
    assert asked[-1] == ("dcgmi diag -r 2 -j", {"timeout_s": 600})  # longer than a node's command timeout
    node, _ = _node({"command -v dcgmi": CommandResult(0, "/usr/bin/dcgmi\n", ""), "dcgmi diag -r 1 -j": CommandResult(1, "", "Error: host engine")})
    verdict = await diag.run(node, 1, 60)
    assert verdict.ran and not verdict.passed and "gave no diagnostic document" in verdict.summary and "host engine" in verdict.summary


def test_only_the_documented_levels_render():
    assert diag.command(1) == "dcgmi diag -r 1 -j"
    for level in (0, 3, "1; reboot"):
        try:
            diag.command(level)
        except ValueError as exc:
            assert "is not one of (1, 2)" in str(exc)
        else:
            raise AssertionError(level)
