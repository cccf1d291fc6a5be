"""The attack suite: each attack of issue 26 repeated on real servers, as an intruder holding one
NATS login (or one job's secrets) would. The remediator's fixtures (a real sshd, SQLite ledger and
the incident-state bucket on a real nats-server) are borrowed from its own tests."""

from tests.remediator.conftest import harness, incidents, make_settings, sleeper, store_url  # noqa: F401
