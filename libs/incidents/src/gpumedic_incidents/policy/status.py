"""The policy's `peer_status`: where a peer daemon's /status answer keeps each field leader-health reads."""

from __future__ import annotations

from typing import Literal

import jmespath
from jmespath.exceptions import JMESPathError
from pydantic import Field, field_validator, model_validator

from gpumedic_incidents.policy.base import Strict

class StatusFields(Strict):
    """JMESPath expressions (jmespath.org) that read a peer daemon's `GET /status`. The cluster's
    fields are read from the document; the `peer_*` fields from each value of a `peers` object
    keyed by node id (a list of ids carries no more than the ids). `not_null(a, b)` takes the first
    field present, so one preset reads several spellings."""

    node_id: str = Field(description="The answering peer's own node id.")
    leader: str = Field(description="The leader it follows; null when it knows none.")
    role: str
    peers: str = Field(description="Its peers: a list of node ids (those it sees alive) or an object keyed by node id.")
    voters_alive: str = Field(description="The voters it counts alive (a number), or the list of their ids.")
    voters_total: str = Field(description="The voters the cluster has.")
    quorum: str = Field(description="Its own verdict on quorum (a boolean), used when it reports no voters.")
    uptime_s: str
    peer_alive: str = Field(description="Whether it counts that peer alive (absent: alive, as it is listed).")
    peer_voter: str = Field(description="Whether that peer votes.")
    peer_jobs: str = Field(description="The jobs that peer runs, as this daemon knows (the leader's view).")
    peer_gpu_percent: str = Field(description="That peer's GPU utilisation in percent, as this daemon knows.")

    @field_validator("*")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            jmespath.compile(value)
        except JMESPathError as exc:
            raise ValueError(f"{value!r} is not a JMESPath expression ({str(exc).splitlines()[0]})") from None
        return value


STATUS_PRESETS: dict[str, StatusFields] = {
    # The runbooks' daemon: `curl -s http://leader:8770/status | jq '.peers["NODE_ID"]'`, each peer
    # with its `selfplay_jobs` and `gpu_percent`; the other names as such daemons spell them.
    "runbook": StatusFields(
        node_id="not_null(node_id, self.node_id, node)",
        leader="not_null(leader_id, leader)",
        role="not_null(role, state)",
        peers="peers",
        voters_alive="not_null(voters_alive, alive_voters, voters.alive, voters)",
        voters_total="not_null(voters_total, total_voters, voters.total, voter_count)",
        quorum="not_null(quorum_ok, has_quorum, quorum)",
        uptime_s="not_null(uptime_s, uptime_seconds, uptime)",
        peer_alive="not_null(alive, is_alive)",
        peer_voter="not_null(is_voter, voter)",
        peer_jobs="not_null(selfplay_jobs, jobs)",
        peer_gpu_percent="not_null(gpu_percent, gpu_utilization)",
    ),
    # gpumedic's first shape: `peers` a list of the ids seen alive, voters as two numbers.
    "plain": StatusFields(
        node_id="node_id", leader="leader", role="role", peers="peers", voters_alive="voters", voters_total="voters_total",
        quorum="quorum", uptime_s="uptime_s", peer_alive="alive", peer_voter="voter", peer_jobs="jobs", peer_gpu_percent="gpu_percent",
    ),
}


class PeerStatusPolicy(Strict):
    """How leader-health reads the peer daemons' `/status`: a preset, and any field changed."""

    preset: Literal["runbook", "plain"] = "runbook"
    fields: dict[str, str] = Field(default_factory=dict, description="Expressions that replace the preset's, by field name.")

    @model_validator(mode="after")
    def _fields_are_known(self) -> PeerStatusPolicy:
        self.expressions()
        return self

    def expressions(self) -> StatusFields:
        unknown = sorted(set(self.fields) - set(StatusFields.model_fields))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; a status has: {', '.join(StatusFields.model_fields)}")
        return StatusFields.model_validate({**STATUS_PRESETS[self.preset].model_dump(), **self.fields})
