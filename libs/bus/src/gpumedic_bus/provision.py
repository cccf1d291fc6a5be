"""Provisioning: every stream, key-value bucket and durable consumer, created once by an admin.

Services never create or change any of these (their NATS users may not): each binds to its own
provisioned consumers, and one whose consumer is missing stops at start naming the command to
run. `gpumedic provision` (compose's one-shot service) and the embedded stack call `provision`,
the bus's counterpart of `gpumedic migrate`. It is idempotent: streams and consumers are created
or updated to the declared settings, buckets created (and given the declared TTL and reads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import BucketNotFoundError, NotFoundError

from gpumedic_bus.connect import connect
from gpumedic_bus.consume import PACED_BATCH
from gpumedic_bus.settings import NatsSettings
from gpumedic_bus.streams import KV_BUCKETS, STREAMS
from gpumedic_bus.topology import DURABLES, Durable

log = logging.getLogger(__name__)

PULL_MAX_ACK_PENDING = 1000


def consumer_config(item: Durable, settings: NatsSettings) -> ConsumerConfig:
    """The consumer as provisioned. Pull consumers redeliver one more time than their service acts,
    so the service dead-letters the last failure instead of the server dropping it; paced
    consumers carry disposable samples (see `PacedConsumer`)."""
    filters = item.filter_subjects
    common = {"durable_name": item.name, "ack_wait": settings.ack_wait_s}
    common |= {"filter_subject": filters[0]} if len(filters) == 1 else {"filter_subjects": list(filters)}
    if item.delivery == "paced":
        return ConsumerConfig(
            **common,
            ack_policy=AckPolicy.ALL,
            max_deliver=2,
            max_ack_pending=8 * PACED_BATCH,
        )
    return ConsumerConfig(
        **common,
        ack_policy=AckPolicy.EXPLICIT,
        max_deliver=settings.max_deliver + 1,
        max_ack_pending=PULL_MAX_ACK_PENDING,
    )


async def wait_for_jetstream(js: JetStreamContext, timeout_s: float = 30.0) -> None:
    """Return once JetStream answers: a cluster that has just started elects its leader first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await js.account_info()
            return
        except Exception as exc:  # no JetStream leader yet (nats-py raises its own errors or a timeout)
            if time.monotonic() > deadline:
                raise TimeoutError(f"JetStream does not answer after {timeout_s:.0f}s (a cluster without a leader?): {exc!r}") from None
            await asyncio.sleep(0.25)


async def provision(js: JetStreamContext, settings: NatsSettings, *, replicas: int = 1) -> list[str]:
    """Create or update every stream, bucket and consumer; return one line per thing created."""
    done: list[str] = []
    for stream in STREAMS:
        config = stream.config(replicas)
        try:
            info = await js.stream_info(stream.name)
        except NotFoundError:
            await js.add_stream(config)
            done.append(f"stream {stream.name} ({', '.join(stream.subjects)})")
            continue
        if info.config.storage != config.storage and stream.replaceable:
            # JetStream cannot change a stream's storage; what it holds is replaced within an interval
            await js.delete_stream(stream.name)
            await js.add_stream(config)
            done.append(f"stream {stream.name} again, on {config.storage.value} storage")
        else:
            await js.update_stream(config)
    for bucket in KV_BUCKETS:
        try:
            kv = await js.key_value(bucket.bucket)
        except BucketNotFoundError:
            await js.create_key_value(dataclasses.replace(bucket, replicas=replicas))
            done.append(f"key-value bucket {bucket.bucket}")
            continue
        config = (await kv.status()).stream_info.config
        # What a bucket's settings may change; a time to live per key (a closed incident's mark)
        # can be allowed on an older release's bucket, never taken back.
        declared = {"max_age": bucket.ttl or None, "allow_direct": bool(bucket.direct), "allow_msg_ttl": True}
        if {"max_age": config.max_age or None, "allow_direct": bool(config.allow_direct), "allow_msg_ttl": bool(config.allow_msg_ttl)} != declared:
            await js.update_stream(dataclasses.replace(config, **declared))
    for item in DURABLES:
        try:
            info = await js.consumer_info(item.stream, item.name)
        except NotFoundError:
            done.append(f"consumer {item.name} on {item.stream} for {item.service}")
        else:
            if info.config.deliver_subject:  # a push consumer of an older release: JetStream cannot make it pull
                await js.delete_consumer(item.stream, item.name)  # only samples were pushed: disposable
                done.append(f"consumer {item.name} on {item.stream} again, as a pull consumer")
        # Create, or update in place to the declared settings.
        await js.add_consumer(item.stream, consumer_config(item, settings))
    for line in done:
        log.info("provisioned %s", line)
    return done


async def keep(js: JetStreamContext, settings: NatsSettings, *, replicas: int = 1, every_s: float = 10.0) -> None:
    """Provision again whenever a stream is gone, until cancelled: a single nats-server that
    restarts comes back without its memory streams (the samples) and their consumers."""
    while True:
        await asyncio.sleep(every_s)
        try:
            missing = [s.name for s in STREAMS if not await _exists(js, s.name)]
            if missing:
                done = await provision(js, settings, replicas=replicas)
                log.warning("the bus had lost %s (a server restarted): provisioned again (%d made)", ", ".join(missing), len(done))
        except Exception as exc:  # the server is away: the next round looks again
            log.info("could not look at the bus's streams yet: %r", exc)


async def _exists(js: JetStreamContext, stream: str) -> bool:
    try:
        await js.stream_info(stream)
    except NotFoundError:
        return False
    return True


REPLICAS_VARIABLE = "GPUMEDIC_PROVISION_REPLICAS"
KEEP_VARIABLE = "GPUMEDIC_PROVISION_KEEP_S"


def main() -> None:
    """`gpumedic-provision`: provision the bus named by GPUMEDIC_NATS_* (the admin user; compose's
    one-shot), with GPUMEDIC_PROVISION_REPLICAS copies of each stream and bucket (1; 3 on a cluster).
    With GPUMEDIC_PROVISION_KEEP_S it then stays, provisioning again whenever a stream is gone
    (compose's `bus-keeper`: a restarted single server loses the samples stream)."""
    import sys

    text = os.environ.get(REPLICAS_VARIABLE, "").strip() or "1"
    if not text.isdigit() or not 1 <= int(text) <= 5:
        sys.exit(f"gpumedic-provision: {REPLICAS_VARIABLE}={text!r} is not a replica count (1 to 5)")
    keep_text = os.environ.get(KEEP_VARIABLE, "").strip() or "0"
    try:
        keep_s = float(keep_text)
    except ValueError:
        keep_s = -1.0
    if not 0 <= keep_s <= 3600:
        sys.exit(f"gpumedic-provision: {KEEP_VARIABLE}={keep_text!r} is not a number of seconds (0: provision once; up to 3600)")

    async def _run() -> list[str]:
        settings = NatsSettings()
        nc = await connect(settings, "gpumedic-provision", max_reconnect_attempts=-1 if keep_s else 3, allow_reconnect=bool(keep_s))
        try:
            js = nc.jetstream()
            await wait_for_jetstream(js)
            done = await provision(js, settings, replicas=int(text))
            print(f"gpumedic-provision: bus provisioned on {text} replica(s) ({len(done)} created, the rest up to date)", flush=True)
            if keep_s:
                await keep(js, settings, replicas=int(text), every_s=keep_s)
            return done
        finally:
            await nc.close()

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_run())
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # one line that says what failed; the cause names no secret
        sys.exit(f"gpumedic-provision: {type(exc).__name__}: {exc}")
