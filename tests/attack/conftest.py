"""The attack suite: each attack of issue 26 repeated on real servers, as an intruder holding one
NATS login (or one job's secrets) would. The remediator's fixtures (a real sshd, SQLite ledger and
the incident-state bucket on a real nats-server) and the end-to-end ones (services started from
their factories, a migrated store) are borrowed from their own tests."""

from tests.e2e.conftest import apps, sampling, store_url  # noqa: F401
from tests.remediator.conftest import harness, incidents, make_settings, sleeper  # noqa: F401
