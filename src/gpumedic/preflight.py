"""`gpumedic preflight`: ask the remediator, over the bus, whether a node's GPUs are ready for a job.

A job launcher calls it right before it starts a job, instead of a launch script that kills and
resets blindly. It connects as the `launcher` NATS user (which may ask this and nothing else),
sends a PreflightRequest and prints the PreflightReport; the exit status is the verdict.
"""

from __future__ import annotations

from gpumedic.operator_bus import ask as ask_bus
from gpumedic_bus import NatsSettings
from gpumedic_events import PREFLIGHT_SUBJECT, PreflightReport, PreflightRequest

SOURCE = "gpumedic-preflight"


async def ask(settings: NatsSettings, request: PreflightRequest, *, timeout_s: float) -> PreflightReport:
    """The remediator's report; operator_bus.NoAnswer when none comes within `timeout_s`."""
    reply = await ask_bus(settings, PREFLIGHT_SUBJECT, request.to_json(), timeout_s=timeout_s, source=SOURCE)
    return PreflightReport.from_json(reply)


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    """`0,1,3` as GPU indexes; None for every GPU. ValueError says what is wrong."""
    if text is None:
        return None
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or not all(w.isdigit() for w in words):
        raise ValueError(f"--gpus {text!r}: give GPU indexes separated by commas, e.g. 0,1")
    return tuple(int(w) for w in words)
