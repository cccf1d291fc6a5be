"""proto/ is what the models give: the drift check passes on the repo and demonstrably fails on drift.

A check that cannot fail proves nothing, so half of these tests break a generated copy on purpose.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpumedic import proto
from gpumedic_events import EVENT_TYPES, SpansExported


def _generate(tmp_path: Path) -> Path:
    out = tmp_path / "proto"
    proto.write(out, proto.render(out))
    return out


def test_committed_proto_is_fresh(proto_dir: Path) -> None:
    problems = proto.drift(proto_dir, proto.render(proto_dir))
    assert problems == [], "proto/ is stale; run `make proto` and commit:\n" + "\n".join(problems)


def test_committed_proto_has_no_breaking_change(proto_dir: Path) -> None:
    assert proto.compatibility_problems(proto_dir) == []


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    assert proto.render(tmp_path) == proto.render(tmp_path)
    for rel, text in proto.render(tmp_path).items():
        assert text.endswith("\n"), rel


def test_check_passes_on_a_fresh_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _generate(tmp_path)
    assert proto.main(out=out, check=True) == 0
    assert "proto/ is up to date" in capsys.readouterr().out


def test_check_reports_an_altered_schema_as_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _generate(tmp_path)
    path = out / "schemas" / "NodeSampled.json"
    schema = json.loads(path.read_text())
    schema["properties"]["interval_s"]["description"] = "edited by hand"
    path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")

    assert proto.main(out=out, check=True) == 1
    err = capsys.readouterr().err
    assert "stale: proto/schemas/NodeSampled.json" in err
    assert "edited by hand" in err, "the report shows a diff excerpt"


def test_check_reports_missing_and_extra_files(tmp_path: Path) -> None:
    out = _generate(tmp_path)
    (out / "examples" / "IncidentOpened.json").unlink()
    (out / "schemas" / "Leftover.json").write_text("{}\n")

    problems = proto.drift(out, proto.render(out))

    assert "missing: proto/examples/IncidentOpened.json" in problems
    assert "extra: proto/schemas/Leftover.json" in problems


def test_generation_repairs_drift_and_removes_extra_files(tmp_path: Path) -> None:
    out = _generate(tmp_path)
    (out / "subjects.md").write_text("stale\n")
    (out / "schemas" / "Leftover.json").write_text("{}\n")

    assert proto.main(out=out) == 0

    assert proto.drift(out, proto.render(out)) == []
    assert not (out / "schemas" / "Leftover.json").exists()


def test_generation_keeps_an_existing_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _generate(tmp_path)
    path = out / "baseline" / "v1" / "ClusterChecked.json"
    baseline = json.loads(path.read_text())
    baseline["properties"]["region"] = {"type": "string"}
    edited = json.dumps(baseline, indent=2, sort_keys=True) + "\n"
    path.write_text(edited)

    assert proto.main(out=out) == 1, "make proto says the models break the baseline"
    assert path.read_text() == edited, "make proto never overwrites a baseline"
    assert proto.main(out=out, check=True) == 1
    assert "ClusterChecked: $.region: property removed" in capsys.readouterr().err

    assert proto.main(out=out, accept_breaking=True) == 0
    assert "region" not in json.loads(path.read_text())["properties"]
    assert proto.main(out=out, check=True) == 0


def test_generation_adds_a_baseline_for_a_new_event(tmp_path: Path) -> None:
    out = _generate(tmp_path)
    path = out / "baseline" / "v1" / "SpansExported.json"
    path.unlink()

    assert "missing: proto/baseline/v1/SpansExported.json" in proto.drift(out, proto.render(out))
    assert proto.main(out=out) == 0
    baseline = json.loads(path.read_text())  # the contract form: the published schema, plus subject and stream
    assert baseline == proto.event_schema(SpansExported)
    assert baseline["x-subject"] == "gpumedic.v1.telemetry.spans.{service}"
    published = json.loads((out / "schemas" / "SpansExported.json").read_text())
    assert {k: v for k, v in baseline.items() if not k.startswith("x-")} == published


def test_an_event_gone_from_the_catalogue_is_breaking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _generate(tmp_path)
    ghost = out / "baseline" / "v1" / "GpuSetOnFire.json"
    ghost.write_text((out / "schemas" / "IncidentOpened.json").read_text())

    assert proto.main(out=out, check=True) == 1
    assert "GpuSetOnFire: event removed from the catalogue" in capsys.readouterr().err
    assert proto.main(out=out) == 1
    assert ghost.exists(), "the baseline of a removed event stays, so the check keeps naming it"


def test_every_event_has_schema_example_and_baseline(proto_dir: Path) -> None:
    for event in EVENT_TYPES:
        name = event.__name__
        for folder in ("schemas", "examples", "baseline/v1"):
            assert (proto_dir / folder / f"{name}.json").is_file(), f"{folder}/{name}.json"


def test_default_proto_dir_is_found_from_a_subfolder(proto_dir: Path) -> None:
    assert proto.default_proto_dir(proto_dir.parent / "libs" / "events" / "src") == proto_dir


def test_the_check_runs_from_the_command_line(proto_dir: Path) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).with_name("gpumedic")), "proto", "--check"],
        cwd=proto_dir.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "proto/ is up to date" in result.stdout
