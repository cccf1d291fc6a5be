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
