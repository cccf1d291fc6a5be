"""Shared fixtures: real servers (nats-server, sshd, PostgreSQL) started on loopback."""

pytest_plugins = [
    "tests.fixtures.nats",
    "tests.fixtures.postgres",
    "tests.fixtures.sshd",
    "tests.fixtures.webhook",
]
