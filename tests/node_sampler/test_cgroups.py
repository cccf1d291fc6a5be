"""Each container's CPU and memory from its cgroup, as `docker stats` reads them: over a tree laid
out as the kernel's cgroup v2 and the engine's two cgroup drivers lay it out (Documentation/
admin-guide/cgroup-v2.rst: memory.current and memory.max in bytes, "max" for no limit; cpu.stat's
usage_usec), and over this machine's own /sys/fs/cgroup."""

from __future__ import annotations

from pathlib import Path

from node_sampler.cgroups import ContainerCgroups

SYSTEMD_ID, CGROUPFS_ID = "a" * 64, "b" * 64


def container(root: Path, path: str, *, memory: int, limit: str, usec: int) -> Path:
    where = root / path
    where.mkdir(parents=True, exist_ok=True)
    (where / "memory.current").write_text(f"{memory}\n")
    (where / "memory.max").write_text(f"{limit}\n")
    (where / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec {usec // 2}\nsystem_usec {usec // 2}\nnr_periods 0\n")
    return where


def test_both_drivers_containers_are_read_with_their_limits_and_cpu_between_two_looks(tmp_path):
    container(tmp_path, f"system.slice/docker-{SYSTEMD_ID}.scope", memory=30 << 30, limit=str(32 << 30), usec=1_000_000)
    late = container(tmp_path, f"docker/{CGROUPFS_ID}", memory=512 << 20, limit="max", usec=0)
    container(tmp_path, "system.slice/sshd.service", memory=1 << 20, limit="max", usec=5)  # not a container
    looks = ContainerCgroups(tmp_path)
    first = {c.container_id: c for c in looks.read(0.0)}
    assert set(first) == {SYSTEMD_ID, CGROUPFS_ID} and all(c.cpu_pct == 0 for c in first.values())
    assert (first[SYSTEMD_ID].memory_mib, first[SYSTEMD_ID].memory_limit_mib) == (30 << 10, 32 << 10)
    assert first[CGROUPFS_ID].memory_limit_mib is None
    container(tmp_path, f"system.slice/docker-{SYSTEMD_ID}.scope", memory=31 << 30, limit=str(32 << 30), usec=1_000_000 + 90_000_000)
    (late / "memory.current").unlink()  # it stopped while looked at
    second = looks.read(30.0)
    assert [(c.container_id, c.cpu_pct, c.memory_mib) for c in second] == [(SYSTEMD_ID, 300.0, 31 << 10)]  # 90 CPU-s in 30 s


def test_a_node_without_containers_or_cgroup_v2_reports_none(tmp_path):
    assert ContainerCgroups(tmp_path / "absent").read(30.0) == ()
    assert isinstance(ContainerCgroups(Path("/sys/fs/cgroup")).read(30.0), tuple)  # this machine's own: no docker here, no error
