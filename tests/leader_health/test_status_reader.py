"""The status reader's fast path: the presets' expressions are read by plain Python that must give
what JMESPath gives, and a peer entry remembered by its content must never stand in for another
(a `true` is no `1`)."""

from __future__ import annotations

import jmespath
import pytest

from gpumedic_incidents.policy import STATUS_PRESETS
from leader_health.status import StatusMismatch, StatusReader, compile_expression

DOCUMENTS = [
    {}, {"node_id": "x"}, {"self": {"node_id": "y"}}, {"self": 3}, {"voters": {"alive": 2, "total": 3}}, {"voters": 5},
    {"leader_id": None, "leader": "p1"}, {"quorum_ok": False, "quorum": True}, {"alive": None, "is_alive": False},
    {"selfplay_jobs": [], "jobs": 1}, {"peers": ["p"]}, {"peers": {"p": {"alive": True}}}, [1], "text", None, 3.5,
]


@pytest.mark.parametrize("preset", sorted(STATUS_PRESETS))
def test_every_preset_expression_reads_as_jmespath_does(preset):
    for expression in STATUS_PRESETS[preset].model_dump().values():
        compiled = compile_expression(expression)
        for document in DOCUMENTS:
            assert compiled.search(document) == jmespath.search(expression, document), (expression, document)


def test_an_entry_seen_before_is_no_stand_in_for_one_of_another_type():
    reader = StatusReader()
    fine = {"node_id": "p1", "leader": "p1", "peers": {"p1": {"alive": True, "selfplay_jobs": 1}, "p2": {"alive": True, "selfplay_jobs": 1}}}
    status = reader.read(fine)
    assert status.loads["p2"].jobs == 1 and status.loads["p1"] is status.loads["p2"]  # one reading for the same entry
    with pytest.raises(StatusMismatch, match=r"peers\['p2'\]: peer_jobs .* found a JSON boolean True, not a count"):
        reader.read({**fine, "peers": {"p1": {"alive": True, "selfplay_jobs": 1}, "p2": {"alive": True, "selfplay_jobs": True}}})
    with pytest.raises(StatusMismatch, match="peer_gpu_percent"):
        reader.read({**fine, "peers": {"p2": {"alive": True, "gpu_percent": 101}}})
