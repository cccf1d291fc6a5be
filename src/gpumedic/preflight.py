"""`gpumedic preflight`: ask the remediator, over the bus, whether a node's GPUs are ready for a job.

A job launcher calls it right before it starts a job, instead of a launch script that kills and
resets blindly. It connects as the `launcher` NATS user (which may ask this and nothing else),
sends a PreflightRequest and prints the PreflightReport; the exit status is the verdict.
"""

from __future__ import annotations

from gpumedic_bus import NatsSettings, connect
from gpumedic_events import PREFLIGHT_SUBJECT, PreflightReport, PreflightRequest

SOURCE = "gpumedic-preflight"


class NoAnswer(RuntimeError):
    """The bus took the request but no remediator answered in time."""


async def ask(settings: NatsSettings, request: PreflightRequest, *, timeout_s: float) -> PreflightReport:
    """The remediator's report; NoAnswer when none comes within `timeout_s`."""
    import nats.errors

    nc = await connect(settings, SOURCE, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        reply = await nc.request(PREFLIGHT_SUBJECT, request.to_json(), timeout=timeout_s)
    except nats.errors.NoRespondersError:
        raise NoAnswer("no remediator is running to answer (no responders on the bus)") from None
    except nats.errors.TimeoutError:
        raise NoAnswer(f"no answer from the remediator within {timeout_s:g}s") from None
    finally:
        await nc.close()
    return PreflightReport.from_json(reply.data)


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    """`0,1,3` as GPU indexes; None for every GPU. ValueError says what is wrong."""
    if text is None:
        return None
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or not all(w.isdigit() for w in words):
        raise ValueError(f"--gpus {text!r}: give GPU indexes separated by commas, e.g. 0,1")
    return tuple(int(w) for w in words)
