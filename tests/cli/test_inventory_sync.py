"""`gpumedic inventory sync` against a server speaking RunPod's REST API: the provider's running
pods become inventory entries, a hand-written entry and the file's comments are never touched, a
pod that goes is marked gone, and a second run changes nothing."""

from __future__ import annotations

import asyncio

import yaml

from gpumedic.cli import main
from gpumedic_nodes.inventory import load_inventory
from tests.fixtures.runpod import KEY

HAND_WRITTEN = """\
# our own machines, and the pods the sync keeps
defaults: {user: gpumedic}
groups:
  lambda: {user: ubuntu}   # behind the bastion
nodes:
  gpu-node-01: {host: 10.0.0.7, group: lambda}   # the box under the desk
  trainer-a: {host: 10.0.0.9}
"""


def _pod(fake, pod_id: str, name: str, ip: str | None, port: int | None) -> None:
    fake.pods[pod_id] = {
        "id": pod_id, "name": name, "desiredStatus": "RUNNING", "costPerHr": 2.99, "gpu": {"id": "H100", "count": 8},
        "lastStartedAt": "2026-11-26T06:00:00.000Z", "publicIp": ip, "portMappings": {"22": port} if port else {},
    }


async def _sync(capsys, inventory, base, key_file, *extra) -> tuple[int, list[str], str]:
    args = ["inventory", "sync", "--inventory", str(inventory), "--api-key-file", str(key_file), "--base-url", base, *extra]
    code = await asyncio.to_thread(main, args)
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


async def test_sync_writes_the_running_pods_and_leaves_everything_else_as_it_was(runpod_api, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GPUMEDIC_REMEDIATOR_PROVIDER", raising=False)
    fake, base = runpod_api
    key_file = tmp_path / "runpod-key"
    key_file.write_text(KEY + "\n")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(HAND_WRITTEN)
    _pod(fake, "abc123pod", "selfplay-7", "203.0.113.7", 40022)
    _pod(fake, "def456pod", "x y", "203.0.113.8", 40023)  # a name that is no node id: the pod id names it
    _pod(fake, "ghi789pod", "starting", None, None)  # no SSH yet
    _pod(fake, "jkl012pod", "trainer-a", "203.0.113.9", 40024)  # named like a node you wrote

    code, out, _ = await _sync(capsys, inventory, base, key_file, "--dry-run")
    assert code == 0 and out[-1] == f"(dry run: {inventory} is unchanged)" and inventory.read_text() == HAND_WRITTEN

    code, out, _ = await _sync(capsys, inventory, base, key_file)
    assert code == 0
    assert out == [
        "added selfplay-7",
        "added def456pod",
        "skipped starting (pod ghi789pod): spawning, no SSH details yet",
        "skipped trainer-a (pod jkl012pod): the inventory has a node of that name it did not write",
        "2 added, 0 updated, 0 unchanged, 0 marked gone, 2 skipped",
    ]
    text = inventory.read_text()
    assert "# the box under the desk" in text and "# behind the bastion" in text  # comments stay
    document = yaml.safe_load(text)
    assert document["nodes"]["trainer-a"] == {"host": "10.0.0.9"}
    assert document["groups"]["runpod"] == {"user": "root", "labels": {"provider": "runpod"}}
    nodes = load_inventory(inventory)  # the remediator reads it
    pod = nodes["selfplay-7"]
    assert (pod.host, pod.port, pod.user, pod.group) == ("203.0.113.7", 40022, "root", "runpod")
    assert dict(pod.labels) == {"provider": "runpod", "pod": "abc123pod", "synced": "runpod"}

    assert (await _sync(capsys, inventory, base, key_file))[1][-1] == "0 added, 0 updated, 2 unchanged, 0 marked gone, 2 skipped"

    fake.pods["abc123pod"]["portMappings"] = {"22": 41000}  # the pod came back on another port
    del fake.pods["def456pod"]
    code, out, _ = await _sync(capsys, inventory, base, key_file)
    assert out[:2] == ["updated selfplay-7", "marked gone def456pod (its pod is no longer listed; remove the entry when you are sure)"]
    nodes = load_inventory(inventory)
    assert nodes["selfplay-7"].port == 41000 and nodes["def456pod"].labels["gone"] == "true"
    assert KEY not in "\n".join(out)


async def test_sync_says_what_is_wrong_with_the_provider_or_the_file(runpod_api, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GPUMEDIC_REMEDIATOR_PROVIDER", raising=False)
    fake, base = runpod_api
    inventory = tmp_path / "inventory.yaml"
    code = await asyncio.to_thread(main, ["inventory", "sync", "--inventory", str(inventory)])
    assert code == 2 and "the provider cannot be used" in capsys.readouterr().err
    key_file = tmp_path / "wrong-key"
    key_file.write_text("rpa_not_the_key\n")
    code, _, err = await _sync(capsys, inventory, base, key_file)
    assert code == 1 and "RunPod refused the API key" in err and not inventory.exists()
    key_file.write_text(KEY + "\n")
    inventory.write_text("- not\n- a mapping\n")
    code, _, err = await _sync(capsys, inventory, base, key_file)
    assert code == 2 and "is not a mapping at the top" in err
