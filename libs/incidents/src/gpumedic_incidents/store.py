"""Open incidents in the JetStream KV bucket `GPUMEDIC_INCIDENT_STATE`, one key per fingerprint;
for an hour after an incident closes, its key keeps the mark of the close.

The key is the fingerprint with `/` made `.` (`gpu-node-07.zombie_job.0`), so the bucket holds at
most one open incident per (node, kind, gpu). Detectors write; the remediator only reads.
"""

from __future__ import annotations

from datetime import datetime

from gpumedic_bus.streams import INCIDENT_STATE
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from gpumedic_incidents.state import IncidentState


CLOSE_KEPT_S = 3600.0
"""How long a closed incident's key keeps the mark of its close: what a restarted detector can know of
the closes before it."""


def state_key(fingerprint: str) -> str:
    return fingerprint.replace("/", ".")


class IncidentStates:
    """The bucket's open incidents, read and written as `IncidentState`."""

    def __init__(self, js: JetStreamContext, kv: KeyValue) -> None:
        self._js = js
        self._kv = kv
        self._stream = f"KV_{INCIDENT_STATE.bucket}"
        self._prefix = f"$KV.{INCIDENT_STATE.bucket}."

    @classmethod
    async def open(cls, js: JetStreamContext) -> IncidentStates:
        """The provisioned bucket (services may not create it)."""
        return cls(js, await js.key_value(INCIDENT_STATE.bucket))

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
        return (await self.load(detector=detector))[0]

    async def load(self, *, detector: str | None = None,
                   closed_since: datetime | None = None) -> tuple[list[IncidentState], dict[str, datetime]]:
        """Every open incident (of one detector, if named), and, by key, when each incident closed
        at or after `closed_since` (a closed incident's key keeps the mark of its close for
        `CLOSE_KEPT_S`, stamped by the server: what a restarted detector needs to know a stale
        finding from a new fault). The keys come from the stream's leader (its subjects), not
        from a watch: a watch started while the stream elects a leader can report no keys at all,
        and a resuming detector would forget every open incident."""
        info = await self._js.stream_info(self._stream, subjects_filter=f"{self._prefix}>")
        states, closed = [], {}
        for key in info.state.subjects or {}:
            try:  # from the leader, as the bucket reads (not a replica's "direct get")
                entry = await self._js.get_msg(self._stream, subject=key, direct=False)
            except NotFoundError:  # purged since
                continue
            if (entry.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
                if closed_since is not None and entry.time is not None and entry.time >= closed_since:
                    closed[key.removeprefix(self._prefix)] = entry.time
                continue
            if entry.data:
                state = IncidentState.model_validate_json(entry.data)
                if detector is None or state.detector == detector:
                    states.append(state)
        return states, closed

    async def save(self, state: IncidentState) -> None:
        await self._kv.put(state_key(state.fingerprint), state.model_dump_json().encode())

    async def delete(self, state: IncidentState) -> None:
        """The incident closed: its key keeps the mark of the close for `CLOSE_KEPT_S`, then the
        bucket forgets it (a purge with a time to live), so the bucket does not grow by every
        fingerprint that was ever open, nor does reading it at start."""
        await self._kv.purge(state_key(state.fingerprint), msg_ttl=CLOSE_KEPT_S)

