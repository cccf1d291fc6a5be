"""Open incidents in the JetStream KV bucket `GPUMEDIC_INCIDENT_STATE`, one key per fingerprint.

The key is the fingerprint with `/` made `.` (`gpu-node-07.zombie_job.0`), so the bucket holds at
most one open incident per (node, kind, gpu). Detectors write; the remediator only reads.
"""

from __future__ import annotations

from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from gpumedic_incidents.state import IncidentState


def state_key(fingerprint: str) -> str:
    return fingerprint.replace("/", ".")


class IncidentStates:
    """The bucket's open incidents, read and written as `IncidentState`."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def get(self, fingerprint: str) -> IncidentState | None:
        try:
            entry = await self._kv.get(state_key(fingerprint))
        except KeyNotFoundError:  # also raised for a deleted key
            return None
        if not entry.value:
            return None
        return IncidentState.model_validate_json(entry.value)

    async def load_all(self, *, detector: str | None = None) -> list[IncidentState]:
        """Every open incident (of one detector, if named)."""
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return []
        states = []
        for key in keys:
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                state = IncidentState.model_validate_json(entry.value)
                if detector is None or state.detector == detector:
                    states.append(state)
        return states

    async def save(self, state: IncidentState) -> None:
        await self._kv.put(state_key(state.fingerprint), state.model_dump_json().encode())

    async def delete(self, state: IncidentState) -> None:
        await self._kv.delete(state_key(state.fingerprint))

