"""InfiniBand and RoCE ports read from a sysfs tree written as the kernel writes it: the formats
of Documentation/ABI/stable/sysfs-class-infiniband and drivers/infiniband/core/sysfs.c (`state`
"%d: %s", `phys_state` "%d: %s", `rate` "%d%s Gb/sec (%dX%s)"), odd files included."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_sampler.nics import NicReader, parse_rate, parse_state


def port(root: Path, device: str, number: int, *, state="4: ACTIVE", phys="5: LinkUp", rate="400 Gb/sec (4X NDR)",
         layer="InfiniBand", **counters: int | str) -> Path:
    base = root / device / "ports" / str(number)
    (base / "counters").mkdir(parents=True)
    for name, text in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", layer)):
        if text is not None:
            (base / name).write_text(f"{text}\n")
    for name, value in {"link_downed": 0, "link_error_recovery": 0, "symbol_error": 0, "port_rcv_errors": 0, **counters}.items():
        (base / "counters" / name).write_text(f"{value}\n")
    return base


@pytest.mark.parametrize(("text", "parsed"), [
    ("4: ACTIVE\n", (4, "ACTIVE")), ("1: DOWN\n", (1, "DOWN")), ("5: ACTIVE_DEFER\n", (5, "ACTIVE_DEFER")),
    ("5: LinkUp\n", (5, "LinkUp")), ("2: Polling\n", (2, "Polling")), ("7: Phy Test\n", (7, "Phy Test")),
    ("ACTIVE\n", None), ("4:\n", None), ("", None),
])
def test_a_state_is_the_kernel_s_number_and_name(text, parsed):
    assert parse_state(text) == parsed


@pytest.mark.parametrize(("text", "gbps"), [
    ("400 Gb/sec (4X NDR)\n", 400.0), ("200 Gb/sec (4X HDR)\n", 200.0), ("100 Gb/sec (4X EDR)\n", 100.0),
    ("2.5 Gb/sec (1X SDR)\n", 2.5), ("56 Gb/sec (4X FDR)\n", 56.0), ("fast\n", None), ("-10 Gb/sec (4X)\n", None),
])
def test_a_rate_is_its_gigabits(text, gbps):
    assert parse_rate(text) == gbps


def test_every_port_of_every_device_with_its_counters(tmp_path):
    port(tmp_path, "mlx5_0", 1, link_downed=2, symbol_error=17)
    port(tmp_path, "mlx5_1", 1, state="1: DOWN", phys="2: Polling", rate="10 Gb/sec (4X SDR)")
    port(tmp_path, "mlx5_2", 1, layer="Ethernet", rate="200 Gb/sec (4X HDR)")
    reading = NicReader(tmp_path).read()
    assert reading.errors == ()
    first, down, roce = reading.ports
    assert (first.device, first.port, first.state, first.phys_state, first.rate_gbps, first.link_layer) == (
        "mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand")
    assert (first.link_downed, first.symbol_error, first.port_rcv_errors, first.local_link_integrity_errors) == (2, 17, 0, None)
    assert (down.state, down.phys_state, roce.link_layer) == ("DOWN", "Polling", "Ethernet")


def test_no_rdma_device_is_no_port_and_odd_files_are_notes_not_failures(tmp_path):
    assert NicReader(tmp_path / "absent").read().ports == ()
    port(tmp_path, "mlx5_0", 1, state="weird", rate=None, symbol_error="n/a")
    (tmp_path / "bad name;rm -rf").mkdir()
    reading = NicReader(tmp_path).read()
    (only,) = reading.ports
    assert (only.state, only.rate_gbps, only.symbol_error, only.phys_state) == (None, None, None, "LinkUp")
    assert any("state is 'weird'" in e for e in reading.errors) and any("no rate" in e for e in reading.errors)
    assert any("symbol_error is 'n/a'" in e for e in reading.errors) and any("device name" in e for e in reading.errors)


def test_a_port_the_event_cannot_carry_is_left_out_with_a_note(tmp_path):
    port(tmp_path, "mlx5_0", 300)  # no port number an HCA has
    port(tmp_path, "mlx5_1", 1, rate="900000 Gb/sec (4X NDR)")
    reading = NicReader(tmp_path).read()
    assert reading.ports == ()
    assert [e.split(":")[0] for e in reading.errors] == ["infiniband mlx5_0 port 300", "infiniband mlx5_1 port 1"]


def test_the_host_reading_carries_the_ports_into_the_sample(tmp_path):
    from node_sampler.host import HostReader
    from node_sampler.readings import host_sample

    port(tmp_path / "ib", "mlx5_0", 1, link_downed=3)
    reading = HostReader(tmp_path / "proc", [], ib_root=tmp_path / "ib").read()
    (carried,) = host_sample(reading).ib_ports
    assert (carried.device, carried.link_downed, carried.rate_gbps) == ("mlx5_0", 3, 400.0)
