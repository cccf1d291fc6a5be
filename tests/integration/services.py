"""Every consuming service as its own `create_app` builds it, for tests that feed it messages: the
files and the migrated store each needs made under a temporary folder first."""

from __future__ import annotations

from pathlib import Path

from autoscaler.main import create_app as autoscaler_app
from autoscaler.settings import Settings as AutoscalerSettings
from gpumedic_bus import NatsSettings
from leader_health.main import create_app as leader_app
from leader_health.settings import Settings as LeaderSettings
from remediator.main import create_app as remediator_app
from remediator.settings import Settings as RemediatorSettings
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from zombie_detector.main import create_app as detector_app
from zombie_detector.settings import Settings as DetectorSettings


def service_app(service: str, nats: NatsSettings, tmp_path: Path):
    """The service's app on `nats`, with what it needs under `tmp_path` (a store, SSH files, a provider)."""
    store = {"url": f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"}
    if service in ("remediator", "report-builder"):
        from gpumedic_store.migrate import upgrade

        upgrade(store["url"])
    if service == "zombie-detector":
        return detector_app(DetectorSettings(nats=nats))
    if service == "autoscaler":  # as the pool's detector (it consumes the remediator's results then)
        (tmp_path / "key").write_text("rpa_unused\n")
        provider = {"kind": "runpod", "api_key_file": str(tmp_path / "key"), "image": "x:1", "base_url": "http://127.0.0.1:9/v1"}
        demand = {"kind": "http", "url": "http://127.0.0.1:9/queue", "queued_path": "queued"}
        return autoscaler_app(AutoscalerSettings(nats=nats, provider=provider, demand=demand))
    if service == "leader-health":
        return leader_app(LeaderSettings(nats=nats))
    if service == "report-builder":
        return reports_app(ReportSettings(nats=nats, store=store, console_port=0))  # the console binds the samples
    import asyncssh

    (tmp_path / "inventory.yaml").write_text("nodes: {}\n")
    (tmp_path / "known_hosts").write_text("")
    (tmp_path / "key").write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    files = {"inventory": tmp_path / "inventory.yaml", "known_hosts": tmp_path / "known_hosts", "client_key": tmp_path / "key"}
    return remediator_app(RemediatorSettings(nats=nats, store=store, **files))
