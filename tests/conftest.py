"""Shared fixtures: real servers (nats-server, sshd, PostgreSQL) started on loopback."""

pytest_plugins = [
    "tests.fixtures.nats",
    "tests.fixtures.postgres",
    "tests.fixtures.runpod",
    "tests.fixtures.sshd",
    "tests.fixtures.webhook",
]
