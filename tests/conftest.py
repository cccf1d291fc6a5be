"""Shared fixtures: real servers (nats-server, sshd, PostgreSQL) started on loopback.

The suite runs 14 hours ahead of UTC (and so does every process it starts): a time read or
written as this machine's local time instead of UTC fails here, where on a UTC machine it passed."""

import os
import time

os.environ["TZ"] = "Pacific/Kiritimati"
time.tzset()

pytest_plugins = [
    "tests.fixtures.real",
    "tests.fixtures.nats",
    "tests.fixtures.postgres",
    "tests.fixtures.runpod",
    "tests.fixtures.sim",
    "tests.fixtures.sshd",
    "tests.fixtures.webhook",
]

SERVERS = frozenset({"nats_server", "secured", "sshd", "postgres_url", "postgres_of_its_own", "fleet"})
"""Fixtures that start a real server process: a test that uses one (directly or through another
fixture), or is marked as needing PostgreSQL or sshd, is in the server tier (marked `servers`);
`make test-fast` runs every service's other tests."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SERVERS & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("postgres") or item.get_closest_marker("sshd"):
            item.add_marker("servers")
