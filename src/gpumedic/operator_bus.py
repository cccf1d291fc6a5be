"""The operator's side of the bus: the `operator` NATS login that `gpumedic silence` and
`gpumedic incidents mark` publish under (only it, and only what operators say), found under the
embedded stack's `--var` when one runs there, else from GPUMEDIC_NATS_* (compose: the operator's
password is in .env).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpumedic.stack import Stack
from gpumedic_bus import NatsSettings, connect
from gpumedic_bus.streams import stream_of
from gpumedic_bus.topology import OPERATOR
from gpumedic_events import Event

SOURCE = "gpumedic-cli"


class OperatorError(RuntimeError):
    """The operator's command cannot be carried out; the message says why and what to do."""


class NoAnswer(OperatorError):
    """The bus took the request but no service answered in time."""


def operator_settings(var_dir: Path, user: str = OPERATOR) -> NatsSettings:
    """The embedded stack's bus under `var_dir` as `user` if one runs there, else GPUMEDIC_NATS_*."""
    if os.environ.get("GPUMEDIC_NATS_URL"):
        return NatsSettings()
    settings = Stack.running(var_dir, user)
    if settings is None:
        raise OperatorError(
            f"no embedded stack runs under {var_dir}/ (start one with `gpumedic up`), and GPUMEDIC_NATS_URL is not set "
            f"(for compose: GPUMEDIC_NATS_URL=tls://HOST:4222 GPUMEDIC_NATS_USER={user} GPUMEDIC_NATS_PASSWORD=... "
            "GPUMEDIC_NATS_TLS_CA_FILE=deploy/secrets/tls/ca.pem)"
        )
    return settings


async def publish(settings: NatsSettings, event: Event) -> None:
    nc = await connect(settings, SOURCE, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        await nc.jetstream().publish(event.subject, event.to_json(), headers={"Nats-Msg-Id": str(event.event_id)}, timeout=5,
                                     stream=stream_of(type(event)).name)
    finally:
        await nc.close()


async def ask(settings: NatsSettings, subject: str, body: bytes, *, timeout_s: float, source: str = SOURCE) -> bytes:
    """The reply to one core-NATS request (`topology.REQUESTS`); NoAnswer when none comes within `timeout_s`."""
    import nats.errors

    nc = await connect(settings, source, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        reply = await nc.request(subject, body, timeout=timeout_s)
    except nats.errors.NoRespondersError:
        raise NoAnswer("no remediator is running to answer (no responders on the bus)") from None
    except nats.errors.TimeoutError:
        raise NoAnswer(f"no answer from the remediator within {timeout_s:g}s") from None
    finally:
        await nc.close()
    return reply.data
