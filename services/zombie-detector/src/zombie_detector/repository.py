"""Open incidents survive a restart: each is kept in a JetStream key-value bucket by fingerprint.

(Idle timers are not kept: after a restart a zombie is found again within `idle_for_s`.)
"""

from __future__ import annotations

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from zombie_detector.logic import TrackedIncident


def _key(fingerprint: str) -> str:
    return fingerprint.replace("/", ".")


async def load_incidents(*, kv: KeyValue) -> list[TrackedIncident]:
    try:
        keys = await kv.keys()
    except Exception as exc:  # nats-py raises NoKeysError for an empty bucket
        if type(exc).__name__ == "NoKeysError":
            return []
        raise
    incidents = []
    for key in keys:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            continue
        if entry.value:
            incidents.append(TrackedIncident.model_validate_json(entry.value))
    return incidents


async def save_incident(*, kv: KeyValue, incident: TrackedIncident) -> None:
    await kv.put(_key(incident.fingerprint), incident.model_dump_json().encode())


async def delete_incident(*, kv: KeyValue, incident: TrackedIncident) -> None:
    await kv.delete(_key(incident.fingerprint))
