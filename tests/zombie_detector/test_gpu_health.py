"""GPU health: gpu_thermal, gpu_throttled, ecc_errors, row_remap, pcie_degraded, nvlink_degraded,
and what a working GPU shows that must open nothing (docs/real-nvml.md: a busy H200 at its power
limit shows SW power cap at 1470-1530 of 1980 MHz)."""

from __future__ import annotations

import pytest

from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    ClockEventReason as R,
    GpuHealth,
    GpuProcess,
    GpuSample,
    GpuXidReported,
    IncidentEscalated,
    IncidentKind as K,
    IncidentOpened,
    IncidentResolved,
    NodeSampled,
    NvLinkSample,
)
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy
from tests.zombie_detector.test_rules import Detector, at

POLICY = Policy(fleet=FleetPolicy(hold_s=0))
H200 = GpuHealth(
    sm_clock_max_mhz=1980, memory_clock_mhz=3201, memory_clock_max_mhz=3201, temperature_slowdown_c=89,
    temperature_shutdown_c=95, temperature_max_operating_c=87, memory_temperature_max_c=95, pcie_link_gen=5,
    pcie_link_gen_max=5, pcie_link_width=16, pcie_link_width_max=16, pcie_replay_count=0, nvlink_count=18,
)
JOB = GpuProcess(pid=4242, start_ticks=77, command="python train.py")
HEALTH_EVERY_S = 30
HEALTH_KINDS = {K.GPU_THERMAL, K.GPU_THROTTLED, K.ECC_ERRORS, K.ROW_REMAP, K.PCIE_DEGRADED, K.NVLINK_DEGRADED}


def gpu(*, util=98, temp=57, memory_temp=46, reasons=int(R.SW_POWER_CAP), sm=1500, dbe=0, sbe=0, pending=False,
        failed=False, processes=(JOB,), health=H200, power_limit=700.0) -> GpuSample:
    return GpuSample(
        index=0, utilization_gpu_pct=util, temperature_c=temp, memory_temperature_c=memory_temp, clock_event_reasons=reasons,
        sm_clock_mhz=sm, ecc_uncorrected_volatile=dbe, ecc_corrected_volatile=sbe, remapped_rows_pending=pending,
        remapped_rows_failed=failed, processes=processes, power_w=power_limit - 9, power_limit_w=power_limit, health=health,
    )


def run(det: Detector, start: int, until: int, every: int = 5, **kwargs) -> list:
    """Samples every `every` s; the health figures only every 30 s, as the sampler sends them."""
    events = []
    for s in range(start, until + 1, every):
        health = kwargs.get("health", H200) if s % HEALTH_EVERY_S == 0 else None
        sample = NodeSampled(source="node-sampler", node_id="n1", interval_s=every, gpus=(gpu(**{**kwargs, "health": health}),))
        events += det.feed(sample, s)
    return events


def opened(events, kind=None) -> list[IncidentOpened]:
    return [e for e in events if isinstance(e, IncidentOpened) and (kind is None or e.kind is kind)]


# --- what a working GPU shows --------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {},                                                           # busy at its power limit: SW power cap
    {"temp": 83, "memory_temp": 80},                              # hot, below the 89 °C slowdown
    {"util": 60, "reasons": int(R.SW_POWER_CAP), "sm": 1100, "power_limit": 400.0},  # a cap the operator set
    {"util": 0, "reasons": int(R.GPU_IDLE), "sm": 345, "processes": ()},  # idle at idle clocks
    {"util": 0, "reasons": int(R.GPU_IDLE), "sm": 345, "processes": (),   # an idle link trained down
     "health": H200.model_copy(update={"pcie_link_gen": 1})},
    {"sbe": 3},                                                   # a few corrected errors
    {"health": H200.model_copy(update={"retired_pages": 1})},     # one retired page, for days
    {"health": H200.model_copy(update={"nvlink_count": 18, "nvlinks": (NvLinkSample(link=2, up=True, crc_errors=3),)})},
])
def test_a_working_gpu_opens_nothing(kwargs):
    det = Detector(POLICY)
    assert opened(run(det, 0, 1800, **kwargs)) == []


# --- gpu_thermal ---------------------------------------------------------------------------


def test_a_gpu_at_its_slowdown_temperature_for_a_minute_goes_to_a_person_and_clears_below_the_margin():
    det = Detector(POLICY)
    run(det, 0, 0)  # the health figures first
    assert opened(run(det, 5, 60, temp=89)) == []  # 55 s hot: not yet
    events = run(det, 65, 65, temp=90)
    (incident,) = opened(events, K.GPU_THERMAL)
    assert incident.gpu_index == 0 and "runs at 90 °C (slowdown at 89 °C)" in incident.summary
    assert incident.evidence["slowdown_c"] == 89 and incident.severity == "critical"  # within 5 °C of 95
    assert any(isinstance(e, IncidentEscalated) for e in events)  # no ladder: a person
    assert run(det, 70, 90, temp=86) == []  # below the threshold but inside the margin: still hot
    (resolved,) = [e for e in run(det, 95, 95, temp=84) if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "cleared"


def test_a_gpu_slowing_itself_down_for_heat_is_thermal_whatever_its_temperature_reads():
    det = Detector(POLICY)
    events = run(det, 0, 120, temp=70, reasons=int(R.HW_SLOWDOWN | R.HW_THERMAL_SLOWDOWN), sm=900)
    (incident,) = opened(events, K.GPU_THERMAL)
    assert "hw_thermal_slowdown" in incident.summary and opened(events, K.GPU_THROTTLED) == []


def test_hbm_at_its_maximum_is_thermal():
    det = Detector(POLICY)
    assert [i.evidence["memory_temperature_c"] for i in opened(run(det, 0, 90, memory_temp=95), K.GPU_THERMAL)] == [95]


# --- gpu_throttled -------------------------------------------------------------------------


def test_a_busy_gpu_under_a_power_brake_for_a_minute_is_throttled():
    det = Detector(POLICY)
    assert opened(run(det, 0, 55, reasons=int(R.HW_SLOWDOWN | R.HW_POWER_BRAKE_SLOWDOWN), sm=700)) == []
    (incident,) = opened(run(det, 60, 60, reasons=int(R.HW_SLOWDOWN | R.HW_POWER_BRAKE_SLOWDOWN), sm=700))
    assert incident.kind is K.GPU_THROTTLED and "SM clock 700 of 1980 MHz at 98% busy" in incident.summary
    assert "hw_power_brake_slowdown" in incident.evidence["clock_event_reasons"]


def test_hardware_slowdown_on_an_idle_gpu_is_not_throttling_a_job():
    det = Detector(POLICY)
    assert opened(run(det, 0, 600, util=0, processes=(), reasons=int(R.HW_SLOWDOWN | R.GPU_IDLE), sm=345)) == []


# --- ecc_errors and row_remap --------------------------------------------------------------


def test_a_new_double_bit_error_drains_the_node_and_an_old_count_is_a_baseline():
    det = Detector(POLICY)
    assert opened(run(det, 0, 30, dbe=2)) == []  # already there when the detector first saw the GPU
    events = run(det, 35, 35, dbe=3)
    (incident,) = opened(events, K.ECC_ERRORS)
    assert "1 new uncorrectable ECC error(s), 3 since the driver loaded" in incident.summary and incident.severity == "critical"
    (request,) = [e for e in events if isinstance(e, ActionRequested)]
    assert request.operation.operation == "drain_node"


def test_corrected_errors_faster_than_the_policy_are_ecc_errors():
    det = Detector(POLICY)
    events = []
    for minute in range(0, 11):
        events += run(det, minute * 60, minute * 60, sbe=minute * 200)  # 12,000 an hour
    (incident,) = opened(events, K.ECC_ERRORS)
    assert "corrected ECC errors at" in incident.summary and incident.severity == "warning"


def test_a_pending_row_remap_drains_then_resets_the_idle_gpu():
    det = Detector(POLICY)
    run(det, 0, 0)
    assert opened(run(det, 5, 5, pending=True, dbe=1, processes=(), util=0, reasons=int(R.GPU_IDLE))) == []  # one sample
    events = run(det, 10, 10, pending=True, dbe=1, processes=(), util=0, reasons=int(R.GPU_IDLE))
    (incident,) = opened(events)  # one fault, one incident: not ecc_errors as well
    assert incident.kind is K.ROW_REMAP and "waits for a GPU reset" in incident.summary
    (drain,) = [e for e in events if isinstance(e, ActionRequested)]
    assert drain.operation.operation == "drain_node"


def test_a_pending_row_remap_under_a_running_job_drains_then_waits_for_the_job_to_end():
    det = Detector(POLICY)
    run(det, 0, 0)
    events = run(det, 5, 10, pending=True, dbe=1)  # busy: a job holds the GPU
    (incident,) = opened(events)
    assert "a job still holds the GPU" in incident.summary
    (drain,) = [e for e in events if isinstance(e, ActionRequested)]
    done = det._commit(det.logic.on_action_completed(ActionCompleted(
        source="remediator", action_id=drain.action_id, incident_id=drain.incident_id, node_id="n1", attempt=1,
        outcome=ActionOutcome.SUCCEEDED, detail="drained n1"), at(11), None))
    (reset,) = [e for e in done if isinstance(e, ActionRequested)]
    assert reset.operation.operation == "gpu_reset"  # offered: the remediator checks on the node
    refused = det._commit(det.logic.on_action_completed(ActionCompleted(
        source="remediator", action_id=reset.action_id, incident_id=reset.incident_id, node_id="n1", attempt=2,
        outcome=ActionOutcome.BLOCKED, in_use=True, detail="refused: GPU 0 runs compute process(es) 4242; not reset"), at(12), None))
    assert [type(e).__name__ for e in refused] == ["IncidentUpdated"] and "waits for n1 GPU 0 to be free" in refused[0].summary
    assert not [e for e in det.events if isinstance(e, IncidentEscalated)]
    (again,) = [e for e in det.tick(12 + 1800) if isinstance(e, ActionRequested)]
    assert again.operation.operation == "gpu_reset" and again.attempt == 3


def test_a_failed_remap_is_for_a_person_after_the_drain():
    det = Detector(POLICY)
    (incident,) = opened(run(det, 0, 10, failed=True))
    assert "row remapping failed" in incident.summary and incident.severity == "critical"


def test_the_memory_fault_of_an_open_xid_incident_opens_nothing_more():
    det = Detector(POLICY)
    run(det, 0, 0)
    det.feed(GpuXidReported(source="node-sampler", node_id="n1", gpu_index=0, xid=48), 1)
    events = run(det, 5, 60, pending=True, dbe=1)
    assert {e.kind for e in opened(det.events)} == {K.GPU_XID} and opened(events) == []


def test_a_memory_xid_after_the_remap_opened_is_the_remaps_fault_and_opens_nothing_more():
    """XID events and samples come over different consumers: a lagging one shows the remap first.
    One memory fault, one incident, one drain (two would ask to drain the node twice at once)."""
    det = Detector(POLICY)
    run(det, 0, 0)
    run(det, 5, 10, pending=True, dbe=1, processes=(), util=0, reasons=int(R.GPU_IDLE))
    events = det.feed(GpuXidReported(source="node-sampler", node_id="n1", gpu_index=0, xid=48), 11)
    events += det.feed(GpuXidReported(source="node-sampler", node_id="n1", gpu_index=0, xid=95), 12)
    assert [e.kind for e in opened(det.events)] == [K.ROW_REMAP] and opened(events) == []
    assert [e.operation.operation for e in det.events if isinstance(e, ActionRequested)] == ["drain_node"]
    # on another GPU the XID is its own fault, and a GPU's other XIDs are not the remap's
    other = det.feed(GpuXidReported(source="node-sampler", node_id="n1", gpu_index=1, xid=48), 13)
    hung = det.feed(GpuXidReported(source="node-sampler", node_id="n1", gpu_index=0, xid=79), 14)
    assert [(e.kind, e.gpu_index) for e in opened(other + hung)] == [(K.GPU_XID, 1), (K.GPU_LOST, 0)]


# --- pcie_degraded and nvlink_degraded -----------------------------------------------------


def test_a_busy_gpus_narrow_link_for_a_minute_is_pcie_degraded_and_its_return_clears_it():
    det = Detector(POLICY)
    narrow = H200.model_copy(update={"pcie_link_width": 8})
    assert opened(run(det, 0, 55, health=narrow)) == []
    (incident,) = opened(run(det, 60, 60, health=narrow))
    assert incident.kind is K.PCIE_DEGRADED and "gen 5 x8 of gen 5 x16" in incident.summary
    (resolved,) = [e for e in run(det, 90, 90) if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "cleared"


def test_a_narrow_link_on_an_idle_gpu_is_not_judged():
    det = Detector(POLICY)
    narrow = H200.model_copy(update={"pcie_link_gen": 1})
    assert opened(run(det, 0, 600, health=narrow, util=0, processes=(), reasons=int(R.GPU_IDLE), sm=345)) == []


def test_pcie_replays_faster_than_eight_a_minute_are_pcie_degraded():
    det = Detector(POLICY)
    run(det, 0, 0, health=H200.model_copy(update={"pcie_replay_count": 100}))
    (incident,) = opened(run(det, 30, 30, health=H200.model_copy(update={"pcie_replay_count": 110})))
    assert "replaying 20 times a minute" in incident.summary


def test_a_link_down_is_nvlink_degraded_and_its_return_clears_it():
    det = Detector(POLICY)
    down = H200.model_copy(update={"nvlinks": (NvLinkSample(link=3, up=False),)})
    (incident,) = opened(run(det, 0, 0, health=down))
    assert incident.kind is K.NVLINK_DEGRADED and "link 3 down (18 links)" in incident.summary
    (resolved,) = [e for e in run(det, 30, 30) if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "cleared"


def test_nvlink_errors_rising_fast_are_nvlink_degraded():
    det = Detector(POLICY)
    run(det, 0, 0, health=H200.model_copy(update={"nvlinks": (NvLinkSample(link=1, up=True, crc_errors=10),)}))
    (incident,) = opened(run(det, 30, 30, health=H200.model_copy(update={"nvlinks": (NvLinkSample(link=1, up=True, crc_errors=40),)})))
    assert "errors at 3600 an hour" in incident.summary


def test_the_health_kinds_are_zombie_detectors_to_open():
    from gpumedic_bus.topology import owner_of

    assert {owner_of(kind) for kind in HEALTH_KINDS} == {"zombie-detector"}


# --- gpu_straggler -------------------------------------------------------------------------


def node(slow: dict[int, dict] | None = None, *, gpus: int = 8) -> NodeSampled:
    """Eight GPUs each running `python -m selfplay --gpu N`, busy at 1980 MHz and 640 W, but those in `slow`."""
    samples = []
    for index in range(gpus):
        fields = {"util": 95, "sm": 1980, "reasons": 0, "power_limit": 700.0, **(slow or {}).get(index, {})}
        job = GpuProcess(pid=1000 + index, start_ticks=7, command=f"python -m selfplay --gpu {index} --games 100000")
        sample = gpu(util=fields["util"], sm=fields["sm"], reasons=fields["reasons"], processes=(job,), health=None,
                     power_limit=fields["power_limit"])
        watts = fields.get("watts", 640.0)
        samples.append(sample.model_copy(update={"index": index, "name": "NVIDIA H100 80GB HBM3", "power_w": watts}))
    return NodeSampled(source="node-sampler", node_id="n1", interval_s=5, gpus=tuple(samples))


def feed(det: Detector, start: int, until: int, slow=None) -> list:
    return [e for s in range(start, until + 1, 5) for e in det.feed(node(slow), s)]


def test_a_gpu_far_slower_than_its_siblings_for_60s_is_a_straggler_and_clears_when_it_keeps_pace():
    det = Detector(POLICY)
    feed(det, 0, 200)  # the fleet's view of the model first (a node is judged every 10 s)
    slow = {5: {"sm": 1188, "watts": 390.0}}
    assert opened(feed(det, 205, 265, slow)) == []  # slow since it was judged at 210
    (incident,) = opened(feed(det, 270, 270, slow))
    assert incident.kind is K.GPU_STRAGGLER and incident.gpu_index == 5
    assert "1188 MHz against its 7 siblings' median 1980 MHz, 390 W against 640 W" in incident.summary
    assert incident.evidence["fleet_median_sm_clock_mhz"] == 1980
    (resolved,) = [e for e in feed(det, 275, 280) if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "cleared"


@pytest.mark.parametrize("slow", [
    {3: {"sm": 1400, "power_limit": 400.0, "watts": 360.0, "reasons": int(R.SW_POWER_CAP)}},  # the operator's cap
    {2: {"sm": 990, "reasons": int(R.HW_SLOWDOWN | R.HW_THERMAL_SLOWDOWN)}},  # heat: gpu_thermal's
    {4: {"util": 0, "sm": 345, "watts": 80.0}},                                # a zombie's idle GPU: not busy
    {i: {"sm": 1400, "watts": 500.0} for i in range(8)},                      # all slow alike: no one GPU's fault
    {1: {"sm": 1800, "watts": 600.0}},                                         # within 15 %
])
def test_what_is_not_a_straggler(slow):
    det = Detector(POLICY)
    feed(det, 0, 200)
    assert opened(feed(det, 105, 400, slow), K.GPU_STRAGGLER) == []


def test_on_a_node_that_runs_below_the_fleet_only_the_gpu_far_below_its_siblings_is_one():
    det = Detector(POLICY)
    feed(det, 0, 200)  # the fleet: 1980 MHz
    everyone_slow = {i: {"sm": 1000 if i == 6 else 1100, "watts": 400.0} for i in range(8)}
    everyone_slow[6]["sm"] = 800
    # GPU 6 is below its siblings and the fleet: a straggler; the others are slow alike, not stragglers
    assert [i.gpu_index for i in opened(feed(det, 205, 400, everyone_slow), K.GPU_STRAGGLER)] == [6]


def test_a_straggler_that_stops_being_busy_starts_its_count_again():
    det = Detector(POLICY)
    feed(det, 0, 200)
    slow = {5: {"sm": 1188, "watts": 390.0}}
    feed(det, 205, 250, slow)  # slow for 40 s of the 60
    feed(det, 255, 400, {5: {"util": 0, "sm": 345, "watts": 80.0}})  # its job pauses: no longer compared
    # slow again: 60 s from now, not at once on the timer of before
    assert opened(feed(det, 405, 455, slow), K.GPU_STRAGGLER) == []
    assert [i.gpu_index for i in opened(feed(det, 460, 480, slow), K.GPU_STRAGGLER)] == [5]
