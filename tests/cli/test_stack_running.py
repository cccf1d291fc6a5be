"""How the CLI finds a running embedded stack's bus: from its server's ports file. Listening on
every address (`gpumedic up --listen 0.0.0.0`) the file lists each, in the order the machine's
interfaces come; the tools take loopback, which the server certificate always names."""

from __future__ import annotations

import json

from gpumedic.stack import Stack


def test_the_loopback_address_is_taken_whatever_the_order(tmp_path):
    var = tmp_path / "var"
    (var / "nats" / "ports").mkdir(parents=True)
    (var / "secrets" / "tls").mkdir(parents=True)
    (var / "secrets" / "tls" / "ca.pem").write_text("a CA\n")
    (var / "secrets" / "nats-passwords.json").write_text(json.dumps({"operator": "pw"}))
    (var / "nats" / "ports" / "nats-server_1.ports").write_text(json.dumps(
        {"nats": ["nats://192.0.2.2:4222", "nats://[::1]:4222", "nats://127.0.0.1:4222", "nats://172.17.0.1:4222"]}))
    settings = Stack.running(var, "operator")
    assert settings is not None and settings.url == "tls://127.0.0.1:4222" and settings.user == "operator"
    assert Stack.running(var, "nobody") is None
