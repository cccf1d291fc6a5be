"""Scenario files and --fault options: parsing, resolution against a fleet, and every error path."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from gpumedic_sim.runs.scenario import (
    CLI_EXAMPLE,
    CLI_SYNTAX,
    MAX_FAULTS,
    SCRIPTED,
    FaultSpec,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    parse_fault_option,
    parse_scenario,
    resolve_scenario_path,
)
from gpumedic.times import parse_time
from gpumedic_sim.faults import DEFAULT_DISK_PATH, DEFAULT_XID, FAULTS, Benign, Fault
from gpumedic_sim.machine.parts import APPLICATION_XIDS

NODES_20 = [f"sim-node-{i:02d}" for i in range(1, 21)]
NODES_22 = [f"sim-node-{i:02d}" for i in range(1, 23)]
NODES_27 = [*NODES_22, "sim-node-23", "sim-node-24", "sim-node-25", "sim-node-26", "sim-node-27"]
SRC = "test.yaml"


def parse(data, *, nodes=NODES_20, gpus=8, seed=0):
    return parse_scenario(data, source=SRC, node_ids=nodes, gpus_per_node=gpus, seed=seed)


def one(fault: dict, **kw) -> FaultSpec:
    return parse({"faults": [fault]}, **kw).faults[0]


def error_of(data, **kw) -> str:
    with pytest.raises(ScenarioError) as info:
        parse(data, **kw)
    return str(info.value)


def write(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the built-in scenario --------------------------------------------------------------------


def test_builtin_scenarios_lists_faults_by_name_and_resolves_it():
    builtins = builtin_scenarios()
    assert "faults" in builtins
    assert builtins["faults"].name == "faults.yaml" and builtins["faults"].is_file()
    assert resolve_scenario_path("faults") == builtins["faults"]


def test_builtin_demand_runs_a_worker_pool_on_a_curve_within_its_duration():
    s = load_scenario(resolve_scenario_path("demand"), node_ids=NODES_20, gpus_per_node=8)
    assert s.faults == () and s.pool is not None
    assert [(d.seconds, d.tasks_per_min) for d in s.pool.demand][:2] == [(30.0, 6.0), (60.0, 60.0)]
    assert s.pool.workers_die_at == (75.0, 280.0) and s.pool.never_ssh_every == 6
    assert s.pool.burn_in and s.pool.machines == 8 and [(b.host_id, b.fault) for b in s.pool.bad_machines] == [
        ("sim-host-002", "gpu_lost"), ("sim-host-003", "pcie_narrow")]
    assert s.pool.scaling.gpu_type == "H100" and s.pool.scaling.max_active_gpus == 16  # the pool's type is the one rented
    assert s.duration_s > s.pool.demand_s


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ({"demand": []}, "x.yaml: pool.demand: Tuple should have at least 1 item"),
        ({"demand": [{"for": "soon", "tasks_per_min": 6}]}, "x.yaml: pool.demand.0.for: 'soon' is not a time"),
        ({"demand": [{"for": "10s", "tasks_per_min": 6}], "scaling": {"min_active_gpus": 9, "max_active_gpus": 8}},
         "x.yaml: pool.scaling: min_active_gpus (9) is above max_active_gpus (8)"),
        ({"demand": [{"for": "10s", "tasks_per_min": 6}], "gpu_type": "H100", "scaling": {"gpu_type": "A100"}},
         "x.yaml: pool: scaling.gpu_type 'A100' is not the pool's gpu_type 'H100'"),
        ({"demand": [{"for": "10s", "tasks_per_min": 6}], "workers": 3}, "x.yaml: pool.workers: Extra inputs are not permitted"),
    ],
)
def test_a_bad_pool_section_says_where_and_what(pool, message):
    with pytest.raises(ScenarioError) as caught:
        parse_scenario({"faults": [], "pool": pool}, source="x.yaml", node_ids=NODES_20, gpus_per_node=8)
    assert str(caught.value).startswith(message)


def test_builtin_faults_loads_for_27_nodes_with_8_gpus():
    s = load_scenario(resolve_scenario_path("faults"), node_ids=NODES_27, gpus_per_node=8)
    assert s.name == "faults"
    assert s.description
    kinds = [f.fault for f in s.faults]
    alone = sorted(set(Fault) - {Fault.JOB_HUNG})  # a job across nodes hangs in the jobs scenario
    assert sorted(kinds) == alone and len(kinds) == len(alone)  # one of each
    on_nodes = [f for f in s.faults if not FAULTS[f.fault].whole_cluster]
    assert len({(f.node, f.gpu) for f in on_nodes}) == len(on_nodes)  # each node fault on its own node or GPU
    node_wide = {f.node for f in on_nodes if f.gpu is None}
    assert all(sum(f.node == node for f in on_nodes) == 1 for node in node_wide)  # a node-wide fault alone on its node
    assert all(f.node in NODES_27 for f in s.faults)
    times = [f.at_s for f in s.faults]
    assert times == sorted(times) and 90 <= times[-1] <= 240
    assert s.duration_s is not None and s.duration_s >= times[-1]
    for f in s.faults:
        assert (f.gpu is not None) == FAULTS[f.fault].gpu
        assert f.gpu is None or 0 <= f.gpu < 8


def test_builtin_faults_works_on_a_bigger_fleet_with_wider_ids():
    nodes = [f"sim-node-{i:03d}" for i in range(1, 101)]
    s = load_scenario(resolve_scenario_path("faults"), node_ids=nodes, gpus_per_node=8)
    assert {f.node for f in s.faults} <= set(nodes[:27])


def test_builtin_faults_fails_clearly_for_5_nodes():
    path = resolve_scenario_path("faults")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, node_ids=NODES_20[:5], gpus_per_node=8)
    message = str(info.value)
    assert message.startswith(f"{path}: faults[")
    assert ".node: " in message and "beyond the fleet's 5 nodes (1-5)" in message


def test_builtin_faults_fails_clearly_for_4_gpus():
    with pytest.raises(ScenarioError, match=r"faults\[\d+\]\.gpu: \d is beyond the fleet's 4 GPUs per node \(0-3\)"):
        load_scenario(resolve_scenario_path("faults"), node_ids=NODES_27, gpus_per_node=4)


def test_resolve_scenario_path_prefers_an_existing_file(tmp_path):
    path = write(tmp_path, "faults: []\n", "faults")
    assert resolve_scenario_path(path) == path
    assert resolve_scenario_path(str(path)) == path


def test_resolve_scenario_path_unknown_name_lists_the_builtins():
    with pytest.raises(ScenarioError) as info:
        resolve_scenario_path("no-such-scenario")
    assert str(info.value).startswith("no-such-scenario: no such file")
    assert "built-in: " in str(info.value) and "faults" in str(info.value)


def test_resolve_scenario_path_refuses_a_directory(tmp_path):
    with pytest.raises(ScenarioError, match="is a directory"):
        resolve_scenario_path(tmp_path)


# --- a valid scenario -------------------------------------------------------------------------


def test_full_example_resolves_nodes_gpus_params_and_sorts_by_time(tmp_path):
    path = write(
        tmp_path,
        """
name: mixed-faults
description: "  a bit of everything  "
duration_s: 2m
faults:
  - at: 40s
    fault: disk_full
    node: 7
    path: /data
  - {at: 10, fault: zombie_job, node: sim-node-03, gpu: 2}
  - {at: 20s, fault: oom_kill, node: 5, gpu: 1}
  - {at: 30s, fault: xid, node: "4", gpu: 0}
  - {at: 10, fault: nvml_missing, node: 1}
""",
    )
    s = load_scenario(path, node_ids=NODES_20, gpus_per_node=8)
    assert s.name == "mixed-faults" and s.description == "a bit of everything" and s.duration_s == 120.0
    assert [(f.at_s, f.fault, f.node, f.gpu) for f in s.faults] == [
        (10.0, Fault.ZOMBIE_JOB, "sim-node-03", 2),  # ties keep file order
        (10.0, Fault.NVML_MISSING, "sim-node-01", None),
        (20.0, Fault.OOM_KILL, "sim-node-05", 1),
        (30.0, Fault.XID, "sim-node-04", 0),
        (40.0, Fault.DISK_FULL, "sim-node-07", None),
    ]
    assert dict(s.faults[3].params) == {"xid": DEFAULT_XID}
    assert dict(s.faults[4].params) == {"path": "/data"}
    assert dict(s.faults[0].params) == {}
    assert s.last_fault_s == 40.0


def test_name_defaults_to_the_file_name(tmp_path):
    s = load_scenario(write(tmp_path, "faults: []\n", "quiet-night.yaml"), node_ids=NODES_20, gpus_per_node=8)
    assert s.name == "quiet-night" and s.faults == () and s.duration_s is None and s.description == ""


def test_defaults_for_xid_and_disk_path():
    assert one({"at": 1, "fault": "xid", "node": 1, "gpu": 0}).params["xid"] == 79
    assert one({"at": 1, "fault": "disk_full", "node": 1}).params["path"] == DEFAULT_DISK_PATH == "/var/lib/docker"
    assert one({"at": 1, "fault": "xid", "node": 1, "gpu": 0, "xid": 48}).params["xid"] == 48


def test_params_cannot_be_changed():
    spec = one({"at": 1, "fault": "xid", "node": 1, "gpu": 0})
    with pytest.raises(TypeError):
        spec.params["xid"] = 13  # type: ignore[index]


def test_with_faults_merges_and_sorts():
    s = parse({"faults": [{"at": 5, "fault": "nvml_missing", "node": 1}, {"at": 50, "fault": "ssh_hangs", "node": 2}]})
    extra = parse_fault_option("fault=ssh_refuses,at=20,node=3", node_ids=NODES_20, gpus_per_node=8)
    merged = s.with_faults([extra])
    assert [f.at_s for f in merged.faults] == [5, 20, 50]
    assert merged.faults[1] == extra and len(s.faults) == 2


def test_fault_spec_reads_well():
    spec = one({"at": 90, "fault": "xid", "node": 3, "gpu": 1, "xid": 48})
    assert str(spec) == "xid at 90s on sim-node-03 GPU 1 xid=48"


# --- times ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (10, 10.0),
        (2.5, 2.5),
        ("10", 10.0),
        ("2.5", 2.5),
        ("10s", 10.0),
        ("2m", 120.0),
        ("1m30s", 90.0),
        ("1.5m", 90.0),
        ("1h", 3600.0),
        ("1h2m3s", 3723.0),
        (" 45S ", 45.0),
        ("1m 30s", 90.0),
    ],
)
def test_time_formats(value, seconds):
    assert parse_time(value) == seconds
    assert one({"at": value, "fault": "nvml_missing", "node": 1}).at_s == seconds


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (-5, "negative"),
        ("-5", "negative"),
        ("-5s", "negative"),
        ("10x", "is not a time; use seconds"),
        ("", "is not a time"),
        ("m", "is not a time"),
        ("s10", "is not a time"),
        ("30s1m", "is not a time"),
        (True, "is not a time"),
        (None, "is not a time"),
        ([10], "is not a time"),
        ("nan", "is not a time"),
        (float("inf"), "not a finite time"),
        (float("nan"), "not a finite time"),
        ("8d", "is beyond the limit of 604800s"),
        (8 * 86_400, "beyond the limit"),
    ],
)
def test_bad_times_say_where_and_why(value, problem):
    message = error_of(
        {"faults": [{"at": 1, "fault": "nvml_missing", "node": 1}, {"at": value, "fault": "nvml_missing", "node": 2}]}
    )
    assert message.startswith(f"{SRC}: faults[1].at: ")
    assert problem in message


def test_missing_time_is_reported():
    message = error_of({"faults": [{"fault": "nvml_missing", "node": 2}]})
    assert message == f"{SRC}: faults[0]: missing field 'at' (nvml_missing needs at, node)"


def test_duration_accepts_durations_and_refuses_nonsense():
    assert parse({"duration_s": "1m30s", "faults": []}).duration_s == 90.0
    assert error_of({"duration_s": 0, "faults": []}) == f"{SRC}: duration_s: must be more than 0"
    assert error_of({"duration_s": "soon", "faults": []}).startswith(f"{SRC}: duration_s: 'soon' is not a time")
    assert parse({"duration_s": None, "faults": []}).duration_s is None


def test_a_fault_after_the_duration_is_refused():
    message = error_of(
        {
            "duration_s": 60,
            "faults": [
                {"at": 60, "fault": "nvml_missing", "node": 1},
                {"at": "61s", "fault": "nvml_missing", "node": 1},
            ],
        }
    )
    assert message == f"{SRC}: faults[1].at: 61s is after the scenario's duration_s (60s)"


# --- nodes and GPUs ---------------------------------------------------------------------------


def test_node_by_id_index_and_digit_text():
    assert one({"at": 1, "fault": "nvml_missing", "node": "sim-node-07"}).node == "sim-node-07"
    assert one({"at": 1, "fault": "nvml_missing", "node": 7}).node == "sim-node-07"
    assert one({"at": 1, "fault": "nvml_missing", "node": "7"}).node == "sim-node-07"
    assert one({"at": 1, "fault": "nvml_missing", "node": 20}).node == "sim-node-20"
    assert one({"at": 1, "fault": "nvml_missing", "node": 1}).node == "sim-node-01"


def test_node_not_in_the_fleet():
    message = error_of({"faults": [{"at": 1, "fault": "nvml_missing", "node": "gpu-node-07"}]})
    assert message == f"{SRC}: faults[0].node: 'gpu-node-07' is not in the fleet (20 nodes: sim-node-01 .. sim-node-20)"


def test_node_with_other_padding_gets_a_hint():
    message = error_of({"faults": [{"at": 1, "fault": "nvml_missing", "node": "sim-node-003"}]})
    assert message.startswith(f"{SRC}: faults[0].node: 'sim-node-003' is not in the fleet")
    assert message.endswith("did you mean 'sim-node-03'?")


@pytest.mark.parametrize(
    ("node", "problem"),
    [
        (0, "0 is not a node index; indexes start at 1 (1-20)"),
        (-3, "-3 is not a node index; indexes start at 1 (1-20)"),
        (21, "21 is beyond the fleet's 20 nodes (1-20)"),
        ("21", "21 is beyond the fleet's 20 nodes (1-20)"),
        (True, "expected a node id, a 1-based index or 'random', got True"),
        (2.0, "expected a node id, a 1-based index or 'random', got 2.0"),
        (None, "expected a node id, a 1-based index or 'random', got None"),
    ],
)
def test_bad_nodes(node, problem):
    assert (
        error_of({"faults": [{"at": 1, "fault": "nvml_missing", "node": node}]}) == f"{SRC}: faults[0].node: {problem}"
    )


def test_gpu_beyond_the_fleet():
    faults = [{"at": 1, "fault": "nvml_missing", "node": 1}] * 3 + [
        {"at": 1, "fault": "zombie_job", "node": 1, "gpu": 9}
    ]
    assert error_of({"faults": faults}) == f"{SRC}: faults[3].gpu: 9 is beyond the fleet's 8 GPUs per node (0-7)"


@pytest.mark.parametrize(
    ("gpu", "problem"),
    [
        (8, "8 is beyond the fleet's 8 GPUs per node (0-7)"),
        (-1, "-1 is not a GPU index (0-7)"),
        ("2", "expected a GPU index (0-7) or 'random', got '2'"),
        (True, "expected a GPU index (0-7) or 'random', got True"),
        (1.5, "expected a GPU index (0-7) or 'random', got 1.5"),
        (None, "expected a GPU index (0-7) or 'random', got None"),
    ],
)
def test_bad_gpus(gpu, problem):
    assert (
        error_of({"faults": [{"at": 1, "fault": "oom_kill", "node": 1, "gpu": gpu}]})
        == f"{SRC}: faults[0].gpu: {problem}"
    )


def test_gpu_fault_on_a_fleet_without_gpus():
    message = error_of({"faults": [{"at": 1, "fault": "zombie_job", "node": 1, "gpu": 0}]}, gpus=0)
    assert message == f"{SRC}: faults[0].gpu: the fleet's nodes have no GPUs"
    assert parse({"faults": [{"at": 1, "fault": "ssh_hangs", "node": 1}]}, gpus=0).faults[0].gpu is None


def test_gpu_given_to_a_node_fault():
    message = error_of({"faults": [{"at": 1, "fault": "ssh_refuses", "node": 1, "gpu": 0}]})
    assert message == f"{SRC}: faults[0].gpu: ssh_refuses is a fault of the whole node and takes no GPU"


def test_gpu_missing_for_a_gpu_fault():
    message = error_of({"faults": [{"at": 1, "fault": "segfault", "node": 1}]})
    assert message == f"{SRC}: faults[0]: missing field 'gpu' (segfault needs at, node, gpu)"


def test_every_kind_takes_a_gpu_or_refuses_one():
    for kind in Fault:
        entry = {"at": 1, "fault": kind.value, "node": 2, "gpu": 5}
        if FAULTS[kind].gpu:
            assert one(entry).gpu == 5
        else:
            with pytest.raises(ScenarioError, match=rf"faults\[0\]\.gpu: {kind.value} is a fault of the whole node"):
                parse({"faults": [entry]})
            del entry["gpu"]
            assert one(entry).gpu is None


# --- random -----------------------------------------------------------------------------------


RANDOM_FAULTS = {"faults": [{"at": i, "fault": "zombie_job", "node": "random", "gpu": "random"} for i in range(30)]}


def test_random_is_reproducible_with_a_seed():
    first = parse(RANDOM_FAULTS, seed=7)
    again = parse(RANDOM_FAULTS, seed=7)
    other = parse(RANDOM_FAULTS, seed=8)
    assert first == again
    assert [(f.node, f.gpu) for f in first.faults] != [(f.node, f.gpu) for f in other.faults]
    assert all(f.node in NODES_20 and 0 <= f.gpu < 8 for f in first.faults)
    assert len({f.node for f in first.faults}) > 1 and len({f.gpu for f in first.faults}) > 1


def test_random_draws_follow_random_random_of_the_seed_in_file_order():
    s = parse({"faults": [{"at": 1, "fault": "xid", "node": "random", "gpu": "random"}]}, seed=3)
    rng = random.Random(3)
    assert s.faults[0].node == rng.choice(NODES_20)
    assert s.faults[0].gpu == rng.randrange(8)


def test_explicit_values_take_no_random_draw():
    mixed = parse(
        {
            "faults": [
                {"at": 1, "fault": "xid", "node": 4, "gpu": 1},
                {"at": 2, "fault": "xid", "node": "random", "gpu": 0},
            ]
        },
        seed=3,
    )
    assert mixed.faults[1].node == random.Random(3).choice(NODES_20)


def test_load_scenario_uses_the_seed(tmp_path):
    path = write(tmp_path, yaml.safe_dump(RANDOM_FAULTS))
    a = load_scenario(path, node_ids=NODES_20, gpus_per_node=8, seed=1)
    b = load_scenario(path, node_ids=NODES_20, gpus_per_node=8, seed=1)
    c = load_scenario(path, node_ids=NODES_20, gpus_per_node=8, seed=2)
    assert a == b and a != c


# --- structure errors -------------------------------------------------------------------------


def test_unknown_fault_kind_lists_the_known_ones():
    message = error_of({"faults": [{"at": 1, "fault": "zombie", "node": 1, "gpu": 0}]})
    assert message.startswith(
        f"{SRC}: faults[0].fault: 'zombie' is not a fault kind nor a benign behaviour (did you mean 'zombie_job'?); known: "
    )
    assert all(k.value in message for k in SCRIPTED)
    assert error_of({"faults": [{"at": 1, "fault": 3, "node": 1}]}).startswith(
        f"{SRC}: faults[0].fault: 3 is not a fault kind nor a benign behaviour; known: zombie_job"
    )


def test_unknown_field_in_a_fault():
    faults = [{"at": 1, "fault": "nvml_missing", "node": 1}] * 2 + [
        {"at": 1, "fault": "zombie_job", "node": 1, "gpus": 2}
    ]
    message = error_of({"faults": faults})
    assert message.startswith(f"{SRC}: faults[2]: unknown field 'gpus'")
    assert "did you mean 'gpu'?" in message and "zombie_job takes: fault, at, node, gpu" in message


def test_a_param_of_another_kind_is_refused():
    message = error_of({"faults": [{"at": 1, "fault": "zombie_job", "node": 1, "gpu": 0, "xid": 79}]})
    assert message == f"{SRC}: faults[0]: field 'xid' applies to xid, not to zombie_job"
    message = error_of({"faults": [{"at": 1, "fault": "xid", "node": 1, "gpu": 0, "path": "/x"}]})
    assert message == f"{SRC}: faults[0]: field 'path' applies to disk_full, not to xid"


def test_unknown_top_level_field():
    message = error_of({"faults": [], "fualts": []})
    assert message.startswith(f"{SRC}: unknown field 'fualts' (did you mean 'faults'?); ")
    assert message.endswith("; a scenario has: name, description, duration_s, faults, pool, expect, policy")


def test_missing_fields():
    assert error_of({"name": "x"}) == f"{SRC}: missing field 'faults' (a list; may be empty)"
    assert error_of({"faults": [{"at": 1, "node": 1}]}) == f"{SRC}: faults[0]: missing field 'fault'"
    assert error_of({"faults": [{"at": 1, "fault": "xid", "gpu": 0}]}) == (
        f"{SRC}: faults[0]: missing field 'node' (xid needs at, node, gpu)"
    )


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ([{"at": 1}], ": expected a mapping with at least `faults`, got a list"),
        ("faults", ": expected a mapping with at least `faults`, got text 'faults'"),
        ({"faults": {"at": 1}}, ": faults: expected a list of faults, got a mapping"),
        ({"faults": "zombie_job"}, ": faults: expected a list of faults, got text 'zombie_job'"),
        (
            {"faults": ["zombie_job@10s"]},
            ": faults[0]: expected a mapping with fault, at, node, got text 'zombie_job@10s'",
        ),
        ({"faults": [{1: 2}]}, ": faults[0]: field names are text, got 1"),
        ({"name": "", "faults": []}, ": name: expected a non-empty text, got ''"),
        ({"name": 5, "faults": []}, ": name: expected a non-empty text, got 5"),
        ({"name": "n" * 201, "faults": []}, ": name: longer than 200 characters"),
        ({"description": ["a"], "faults": []}, ": description: expected text, got a list"),
    ],
)
def test_shapes_that_are_not_scenarios(data, problem):
    assert error_of(data) == SRC + problem


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"xid": "79"}, "faults[0].xid: expected an XID number, got '79'"),
        ({"xid": -1}, "faults[0].xid: -1 is not an XID (0 to 4294967295)"),
        ({"xid": 2**32}, "faults[0].xid: 4294967296 is not an XID (0 to 4294967295)"),
        ({"xid": True}, "faults[0].xid: expected an XID number, got True"),
    ],
)
def test_bad_xid(extra, problem):
    assert error_of({"faults": [{"at": 1, "fault": "xid", "node": 1, "gpu": 0, **extra}]}) == f"{SRC}: {problem}"


@pytest.mark.parametrize("path", ["var/lib/docker", 5, "", "/a\nb", "/" + "x" * 300])
def test_bad_disk_path(path):
    message = error_of({"faults": [{"at": 1, "fault": "disk_full", "node": 1, "path": path}]})
    assert message.startswith(f"{SRC}: faults[0].path: ")


def test_empty_fault_list_is_fine():
    assert parse({"faults": []}).faults == ()
    assert parse({"faults": None}).faults == ()


def test_too_many_faults():
    entry = {"at": 1, "fault": "nvml_missing", "node": 1}
    assert len(parse({"faults": [entry] * MAX_FAULTS}).faults) == MAX_FAULTS
    message = error_of({"faults": [entry] * (MAX_FAULTS + 1)})
    assert message == f"{SRC}: faults: {MAX_FAULTS + 1} faults; at most {MAX_FAULTS} are allowed"


# --- files ------------------------------------------------------------------------------------


def test_a_file_error_names_the_file(tmp_path):
    path = write(
        tmp_path, "faults:\n  - {at: 1, fault: nvml_missing, node: 1}\n  - {at: 1, fault: nvml_missing, node: 99}\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, node_ids=NODES_20, gpus_per_node=8)
    assert str(info.value) == f"{path}: faults[1].node: 99 is beyond the fleet's 20 nodes (1-20)"
    assert info.value.source == str(path) and info.value.where == "faults[1].node"
    assert isinstance(info.value, ValueError)


def test_yaml_syntax_error_gives_the_line(tmp_path):
    path = write(tmp_path, "name: x\nfaults:\n  - {at: 1, fault: xid\n  - at: 2\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, node_ids=NODES_20, gpus_per_node=8)
    message = str(info.value)
    assert message.startswith(f"{path}: line ")
    assert ": not valid YAML: " in message
    line = int(message.split("line ")[1].split(",")[0])
    assert 3 <= line <= 4


def test_yaml_tab_indentation_error_gives_the_line(tmp_path):
    path = write(tmp_path, "faults:\n\t- at: 1\n")
    with pytest.raises(ScenarioError, match=r": line 2, column 1: not valid YAML"):
        load_scenario(path, node_ids=NODES_20, gpus_per_node=8)


def test_unsafe_yaml_tags_are_refused(tmp_path):
    path = write(tmp_path, "faults: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(path, node_ids=NODES_20, gpus_per_node=8)


def test_empty_and_scalar_files(tmp_path):
    with pytest.raises(ScenarioError, match=r"empty.yaml: is empty; expected a mapping"):
        load_scenario(write(tmp_path, "", "empty.yaml"), node_ids=NODES_20, gpus_per_node=8)
    with pytest.raises(ScenarioError, match=r"scalar.yaml: expected a mapping with at least `faults`, got a number"):
        load_scenario(write(tmp_path, "42\n", "scalar.yaml"), node_ids=NODES_20, gpus_per_node=8)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(ScenarioError, match=r"nope.yaml: cannot read: No such file"):
        load_scenario(tmp_path / "nope.yaml", node_ids=NODES_20, gpus_per_node=8)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"faults: []\n\xff\xfe")
    with pytest.raises(ScenarioError, match=r"bin.yaml: not UTF-8 text \(byte 11\)"):
        load_scenario(binary, node_ids=NODES_20, gpus_per_node=8)


# --- --fault ----------------------------------------------------------------------------------


def opt(text: str, **kw) -> FaultSpec:
    return parse_fault_option(text, node_ids=NODES_20, gpus_per_node=8, **kw)


def opt_error(text: str, **kw) -> str:
    with pytest.raises(ScenarioError) as info:
        opt(text, **kw)
    return str(info.value)


def test_fault_option_syntax():
    spec = opt(CLI_EXAMPLE)
    assert (spec.at_s, spec.fault, spec.node, spec.gpu) == (10.0, Fault.ZOMBIE_JOB, "sim-node-03", 2)
    spec = opt(" fault = xid , at = 1m30s , node = sim-node-11 , gpu = 0 , xid = 48 ")
    assert (spec.at_s, spec.fault, spec.node, spec.gpu, dict(spec.params)) == (
        90.0,
        Fault.XID,
        "sim-node-11",
        0,
        {"xid": 48},
    )
    spec = opt("fault=disk_full,at=40,node=7,path=/data")
    assert spec.params["path"] == "/data" and spec.gpu is None


@pytest.mark.parametrize("text", ["", "   ", "zombie_job@10s:3/2", "fault=zombie_job,at", "=3,fault=xid"])
def test_fault_option_bad_syntax_shows_the_expected_syntax(text):
    message = opt_error(text)
    assert message.startswith(f"--fault {text!r}: ")
    assert f"expected {CLI_SYNTAX}, e.g. {CLI_EXAMPLE}" in message


def test_fault_option_errors_name_the_field():
    assert opt_error("fault=xid,at=1,node=1,gpu=1,gpu=2").startswith(
        "--fault 'fault=xid,at=1,node=1,gpu=1,gpu=2': gpu: given twice"
    )
    assert opt_error("fault=zombie_job,at=1,node=1,gpu=9") == (
        "--fault 'fault=zombie_job,at=1,node=1,gpu=9': gpu: 9 is beyond the fleet's 8 GPUs per node (0-7)"
    )
    assert "at: '-3' is negative" in opt_error("fault=sigterm,at=-3,node=1,gpu=0")
    assert "fault: 'zombie' is not a fault kind" in opt_error("fault=zombie,at=1,node=1,gpu=0")
    assert "missing field 'gpu'" in opt_error("fault=sigterm,at=1,node=1")
    assert "expected fault=KIND" in opt_error("fault=sigterm,at=1,node=1")
    assert "xid: expected an XID number, got 'abc'" in opt_error("fault=xid,at=1,node=1,gpu=0,xid=abc")
    assert "after the scenario's duration_s (10s)" in opt_error("fault=ssh_hangs,at=11,node=1", duration_s=10)


def test_fault_option_random_is_reproducible_and_a_shared_rng_differs():
    assert opt("fault=xid,at=1,node=random,gpu=random", seed=5) == opt("fault=xid,at=1,node=random,gpu=random", seed=5)
    rng = random.Random(5)
    drawn = [opt("fault=xid,at=1,node=random,gpu=random", rng=rng) for _ in range(10)]
    assert len({(s.node, s.gpu) for s in drawn}) > 1


# --- the table ----------------------------------------------------------------------------------


def test_every_kind_is_in_the_table_and_sim_kinds_lists_it():
    from gpumedic_sim.commands import kinds_text

    assert set(SCRIPTED) == {*Fault, *Benign} == set(FAULTS)
    assert FAULTS[Fault.XID].gpu and not FAULTS[Fault.DISK_FULL].gpu
    lines = kinds_text().splitlines()
    assert [line.split()[0] for line in lines] == [k.value for k in SCRIPTED]
    xid = next(line for line in lines if line.startswith("xid "))
    assert "gpu, xid (=79)" in xid and "[gpu_xid]" in xid
    assert "[no incident]" in next(line for line in lines if line.startswith("short_dip "))


# --- benign behaviour ---------------------------------------------------------------------------


def test_benign_behaviours_are_scripted_like_faults_with_their_own_fields():
    scenario = parse({
        "faults": [
            {"at": "5s", "fault": "job_finished", "node": 2, "gpu": 0},
            {"at": "10s", "fault": "short_dip", "node": 3, "gpu": 1, "for": "15s"},
            {"at": "12s", "fault": "checkpoint_pause", "node": 4, "gpu": 2},
        ]
    })
    assert [(f.fault, f.gpu, dict(f.params)) for f in scenario.faults] == [
        (Benign.JOB_FINISHED, 0, {}),
        (Benign.SHORT_DIP, 1, {"for": 15.0}),
        (Benign.CHECKPOINT_PAUSE, 2, {"for": 60.0}),
    ]
    assert opt("fault=short_dip,at=1,node=1,gpu=0,for=20s").params["for"] == 20.0
    assert "for: must be longer than 0s" in opt_error("fault=short_dip,at=1,node=1,gpu=0,for=0")
    assert "for: 'soon' is not a time" in opt_error("fault=short_dip,at=1,node=1,gpu=0,for=soon")
    assert "field 'for' applies to quorum_lost, split_brain, leader_flapping, peer_partitioned, short_dip, checkpoint_pause, rows_in_free_pages, planned_restart, job_checkpoint, checkpoint_rewritten, not to zombie_job" in opt_error(
        "fault=zombie_job,at=1,node=1,gpu=0,for=5s"
    )
    assert "missing field 'gpu'" in opt_error("fault=job_finished,at=1,node=1")


def test_the_builtin_benign_scenario_is_benign_only():
    scenario = load_scenario(builtin_scenarios()["benign"], node_ids=NODES_20, gpus_per_node=8)
    assert scenario.faults and all(f.fault in set(Benign) or f.fault is Fault.XID for f in scenario.faults)
    assert {f.params["xid"] for f in scenario.faults if f.fault is Fault.XID} <= APPLICATION_XIDS



def test_a_scenario_may_say_what_its_run_must_reach():
    scenario = parse({"faults": [], "expect": {"recall": 1, "precision": 0.9, "false_positives": 0}})
    assert (scenario.expect.recall, scenario.expect.precision, scenario.expect.false_positives) == (1.0, 0.9, 0)
    assert parse({"faults": []}).expect is None
    assert error_of({"faults": [], "expect": {"recall": 2}}) == f"{SRC}: expect.recall: Input should be less than or equal to 1"
    assert error_of({"faults": [], "expect": {"recal": 1}}) == f"{SRC}: expect.recal: Extra inputs are not permitted"


def test_a_scenario_s_policy_is_checked_over_the_shipped_one_when_read():
    good = parse_scenario({"faults": [], "policy": {"kinds": {"gpu_xid": {"checkpoint": {"how": "file"}}}}}, source=SRC,
                          node_ids=["n1"], gpus_per_node=1)
    assert good.policy == {"kinds": {"gpu_xid": {"checkpoint": {"how": "file"}}}}
    assert error_of({"faults": [], "policy": {"kinds": {"gpu_xid": {"checkpoint": {"how": "shout"}}}}}).startswith(
        f"{SRC}: policy.kinds.gpu_xid.checkpoint.how: Input should be 'signal', 'file' or 'http'")
    assert error_of({"faults": [], "policy": ["kinds"]}) == f"{SRC}: policy: expected a mapping (a part of a policy file), got a list"


def test_a_jobs_nccl_is_a_version_or_none():
    assert one({"at": 1, "fault": "job_across_nodes", "node": 1}).params["nccl"] == "2.29.1"
    assert one({"at": 1, "fault": "job_across_nodes", "node": 1, "nccl": "2.26.5"}).params["nccl"] == "2.26.5"
    assert one({"at": 1, "fault": "job_across_nodes", "node": 1, "nccl": "none"}).params["nccl"] is None
    for bad in (2.26, "latest", "2.29.1; reboot"):
        message = error_of({"faults": [{"at": 1, "fault": "job_across_nodes", "node": 1, "nccl": bad}]})
        assert message.startswith(f"{SRC}: faults[0].nccl: expected an NCCL version such as 2.29.1, or none"), message
    assert "rank_stopped" in error_of({"faults": [{"at": 1, "fault": "job_hung", "node": 1, "cause": "meltdown"}]})
