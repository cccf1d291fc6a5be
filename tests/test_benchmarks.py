"""Every benchmark runs once, small, so that none breaks unseen between two `make bench` runs (the
probe round did: it stopped at a simulated-cluster change, and the benchmarks after it never ran).
Only that each runs to its end, prints its figures and (where it counts them) found every fault is
asserted here: the figures themselves are `make bench`'s, on a quiet machine."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import ALL, run

SMALL = {
    "sample_path": ["--messages", "500", "--rounds", "1", "--rate", "200", "--seconds", "1"],
    "sampler_cost": [],
    "detection_latency": ["--nodes", "20", "--faults", "3", "--interval", "1"],
    "fleet_scale": ["--scale-nodes", "50", "--scale-interval", "1", "--scale-duration", "5", "--scale-zombies", "2"],
    "overload": ["--overload-nodes", "50", "--overload-interval", "1", "--overload-duration", "4", "--overload-zombies", "1", "--overload-recover", "30"],
    "incident_to_fix": ["--fix-nodes", "4", "--fix-faults", "1", "--fix-interval", "1", "--fix-duration", "40"],
    "preflight": ["--preflight-gpus", "2", "--preflight-runs", "2"],
    "probe_round": ["--probe-peers", "20", "--probe-rounds", "1"],
    "demand_curve": [],
    "console_pages": ["--console-incidents", "50", "--console-runs", "2"],
    "node_history": ["--history-nodes", "20", "--history-minutes", "90", "--history-runs", "2"],
}


WHOLE = {"detection_latency": "3 of 3 hardware XIDs to their incident"}
"""What a short run must say it found: a run that missed some still prints figures (of the rest)."""


def _name(benchmark) -> str:
    return benchmark.__name__.rsplit(".", 1)[-1]


def test_every_benchmark_has_its_short_mode():
    assert set(SMALL) == {_name(b) for b in ALL}


@pytest.mark.long
@pytest.mark.timeout(240)
@pytest.mark.parametrize("benchmark", ALL, ids=lambda m: _name(m))
def test_the_benchmark_runs_to_its_end_in_its_short_mode(benchmark, capsys):
    run(benchmark, SMALL[_name(benchmark)])
    printed = capsys.readouterr().out
    assert any(ch.isdigit() for ch in printed), f"{benchmark.__name__} printed no figures: {printed!r}"
    assert WHOLE.get(_name(benchmark), "") in printed, printed
