"""Your own consumer of gpumedic's incidents, in Python: nats-py and jsonschema, no gpumedic import.

It logs in as the `observer` NATS user, whose account receives every gpumedic event and has a
JetStream of its own. There it keeps a stream of the incident events and a durable consumer, so
it picks up where it left off after a restart. The stream has the name of gpumedic's own
(GPUMEDIC_INCIDENTS, from subjects.json): gpumedic publishes with a Nats-Expected-Stream header,
which a stream of any other name refuses. Every message is validated against its schema from
proto/schemas/ (which one, by subject, from proto/subjects.json); one that does not validate is
reported and terminated (a producer's bug), never a crash. Each valid incident event is printed
as one JSON line: what a pager, a ticket or a chat bot would start from.

    NATS_URL=tls://127.0.0.1:4222 NATS_USER=observer NATS_PASSWORD=... NATS_CA=var/secrets/tls/ca.pem \\
        python examples/python/consumer.py

Settings (environment): NATS_URL, NATS_USER (observer), NATS_PASSWORD, NATS_CA (the CA file, for
tls:// URLs), PROTO_DIR (../../proto from here), STREAM (GPUMEDIC_INCIDENTS), DURABLE (python-example),
START: where a new durable begins: `new` (the default: events from now on), `all` (everything the
stream holds: `gpumedic up` keeps it from the stack's start) or a time (2026-11-26T09:00:00Z). A
durable that exists already goes on where it left off. Ctrl-C stops it within a second.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import sys
from datetime import datetime
from pathlib import Path

import nats
from jsonschema import Draft202012Validator
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError

INCIDENTS = "gpumedic.v1.incident.>"


def validators(proto: Path) -> dict[str, tuple[str, Draft202012Validator]]:
    """Subject prefix -> (event name, its schema's validator), for the incident events."""
    out = {}
    for entry in json.loads((proto / "subjects.json").read_text())["subjects"]:
        if entry["filter"].startswith("gpumedic.v1.incident."):
            schema = json.loads((proto / entry["schema"]).read_text())
            checker = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
            out[entry["filter"].removesuffix(".*")] = (entry["event"], checker)
    return out


def start_position(start: str) -> dict:
    """START as a consumer's deliver policy (and start time)."""
    if start in ("", "new"):
        return {"deliver_policy": DeliverPolicy.NEW}
    if start == "all":
        return {"deliver_policy": DeliverPolicy.ALL}
    try:
        when = datetime.fromisoformat(start.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"START={start!r}: use new, all or an ISO 8601 time such as 2026-11-26T09:00:00Z") from None
    return {"deliver_policy": DeliverPolicy.BY_START_TIME, "opt_start_time": when.isoformat().replace("+00:00", "Z")}


async def main() -> int:
    env = os.environ
    proto = Path(env.get("PROTO_DIR", Path(__file__).resolve().parents[2] / "proto"))
    known = validators(proto)
    stream, durable = env.get("STREAM", "GPUMEDIC_INCIDENTS"), env.get("DURABLE", "python-example")
    tls = ssl.create_default_context(cafile=env["NATS_CA"]) if env.get("NATS_CA") else None
    user = env.get("NATS_USER", "observer")
    nc = await nats.connect(env.get("NATS_URL", "nats://127.0.0.1:4222"), user=user, password=env.get("NATS_PASSWORD"),
                            tls=tls, inbox_prefix=f"_INBOX.{user}", name=durable)
    js = nc.jetstream()
    try:
        await js.add_stream(name=stream, subjects=[INCIDENTS], max_age=7 * 24 * 3600)
    except BadRequestError:
        pass  # it exists already (made by an earlier run)
    start = start_position(env.get("START", "new"))
    sub = await js.pull_subscribe(INCIDENTS, durable=durable, stream=stream,
                                  config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_deliver=5, **start))
    print(json.dumps({"ready": True, "stream": stream, "durable": durable, "start": env.get("START", "new")}), flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    while not stop.is_set() and not nc.is_closed:
        try:
            messages = await sub.fetch(16, timeout=1)
        except TimeoutError:  # nothing new within the second (nats-py raises its own or asyncio's)
            continue
        except nats.errors.Error as exc:  # the server restarting: the client reconnects by itself
            print(json.dumps({"waiting": str(exc)}), file=sys.stderr, flush=True)
            await asyncio.sleep(1)
            continue
        for msg in messages:
            event, checker = known.get(msg.subject.rsplit(".", 1)[0], (None, None))
            try:
                payload = json.loads(msg.data)
                errors = [] if checker is None else sorted(checker.iter_errors(payload), key=str)
            except ValueError as exc:
                payload, errors = None, [exc]
            if event is None or errors:
                why = "no schema for this subject" if event is None else str(errors[0])[:300]
                print(json.dumps({"invalid": msg.subject, "why": why}), file=sys.stderr, flush=True)
                await msg.term()  # a producer's bug: never redelivered, never a crash
                continue
            print(json.dumps({"event": event, "incident_id": payload["incident_id"], "kind": payload["kind"],
                              "node_id": payload["node_id"], "summary": payload.get("summary", "")}), flush=True)
            await msg.ack()
    if not nc.is_closed:
        try:
            await nc.close()  # what was printed was acked; the rest waits in the durable for the next run
        except (OSError, AttributeError):
            # The server went first: nats-py flushes what it buffered meanwhile to a dead socket (an
            # OSError, or on TLS asyncio's AttributeError from a transport already torn down). What
            # was printed was acked; unacked events wait in the durable.
            pass
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
