"""nic_degraded and nic_flapping from the ports a sample carries: a port that was up and went
down or trained down below its siblings, a link that keeps going down or counting errors; a port
nobody cabled, counters reset by a reboot and a steady link open nothing."""

from __future__ import annotations

from gpumedic_events import HostSample, IbPort, IncidentKind, IncidentResolved, NodeSampled
from gpumedic_incidents import Policy
from tests.zombie_detector.test_rules import POLICY, Detector, sample


def ib(device: str, *, state="ACTIVE", phys="LinkUp", rate=400.0, layer="InfiniBand", downs=0, errors=0) -> IbPort:
    return IbPort(device=device, port=1, state=state, phys_state=phys, rate_gbps=rate, link_layer=layer, link_downed=downs,
                  symbol_error=errors, port_rcv_errors=0, link_error_recovery=0)


def with_ports(*ports: IbPort, node: str = "n1") -> NodeSampled:
    base = sample(node)
    return base.model_copy(update={"host": HostSample(**{**base.host.model_dump(), "ib_ports": ports})})


HEALTHY = [ib(f"mlx5_{i}") for i in range(4)]


def test_a_port_that_was_up_and_goes_down_is_degraded_after_for_s_and_resolved_when_back():
    d = Detector()
    d.feed(with_ports(*HEALTHY), 0)
    down = [*HEALTHY[:2], ib("mlx5_2", state="DOWN", phys="Polling", rate=None), HEALTHY[3]]
    assert d.feed(with_ports(*down), 5) == []  # a port retraining for a moment is no incident
    d.feed(with_ports(*down), 70)
    (opened,) = d.opened(IncidentKind.NIC_DEGRADED)
    assert opened.fingerprint.startswith("n1/nic_degraded/") and opened.fingerprint.endswith("/mlx5_2-p1")
    assert opened.summary == "mlx5_2 port 1 is DOWN (Polling); it was up"
    d.feed(with_ports(*HEALTHY), 80)
    assert [e.resolution for e in d.events if isinstance(e, IncidentResolved)] == ["cleared"]


def test_a_port_that_trained_down_is_degraded_and_neither_a_slower_nic_nor_one_never_up_is():
    """A port below the rate it ran at is degraded; a node's 100 Gb/s front-end NIC beside its
    400 Gb/s fabric is how the node was built, and a port never up is nobody's cable."""
    d = Detector()
    built = [*HEALTHY, ib("mlx5_9", state="DOWN", phys="Disabled", rate=None), ib("roce0", rate=100.0, layer="Ethernet"),
             ib("roce1", rate=400.0, layer="Ethernet")]
    d.feed(with_ports(*built), 0)
    slow = [*HEALTHY[:3], ib("mlx5_3", rate=200.0), *built[4:]]
    for s in (30, 65, 100):
        d.feed(with_ports(*slow), s)
    (opened,) = d.opened(IncidentKind.NIC_DEGRADED)
    assert opened.summary == "mlx5_3 port 1 runs at 200 Gb/s where it ran at 400"
    assert opened.evidence["rate_gbps"] == 200.0


def test_a_link_that_keeps_going_down_or_counting_errors_is_flapping_and_a_reset_is_not():
    d = Detector()
    for s, downs in ((0, 5), (60, 5), (120, 6), (180, 7)):
        d.feed(with_ports(*HEALTHY[:3], ib("mlx5_3", downs=downs)), s)
    (flap,) = d.opened(IncidentKind.NIC_FLAPPING)
    assert flap.summary.startswith("mlx5_3 port 1 went down 2 time(s) in 3m00s (link_downed 5 -> 7)")

    errors = Detector()
    for s, count in ((0, 0), (300, 50_000), (600, 100_000)):
        errors.feed(with_ports(*HEALTHY[:3], ib("mlx5_3", errors=count)), s)
    (noisy,) = errors.opened(IncidentKind.NIC_FLAPPING)
    assert noisy.summary == "mlx5_3 port 1 counted 50000 link errors in 5m00s (600000/h, more than 1000/h)"

    reset = Detector()
    for s, downs in ((0, 40), (60, 0), (120, 0), (180, 1)):
        reset.feed(with_ports(*HEALTHY[:3], ib("mlx5_3", downs=downs)), s)
    assert reset.opened(IncidentKind.NIC_FLAPPING) == []  # the counters started again at a reboot: one down since


def test_a_node_without_rdma_ports_and_a_steady_fabric_open_nothing():
    d = Detector(Policy.model_validate({"fleet": {"hold_s": 0}}))
    for s in range(0, 600, 30):
        d.feed(with_ports(*HEALTHY), s)
        d.feed(sample("n2"), s)
    assert d.opened(IncidentKind.NIC_DEGRADED) == [] and d.opened(IncidentKind.NIC_FLAPPING) == []
    assert POLICY.kinds.nic_degraded.ladder == () and POLICY.kinds.nic_flapping.ladder == ()
