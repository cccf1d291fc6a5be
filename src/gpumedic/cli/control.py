"""A person's hand on the remediator: the breaker, a fleet-wide pause, and the dead letters the services refused."""

from __future__ import annotations

import asyncio
import sys

import click

from gpumedic.cli.core import NoStore, by_option, command, json_option, store_option, store_url, var_option
from gpumedic.services import SERVICES


def cmd_breaker(args) -> int:
    """The remediator's fleet circuit breaker: it stays open until a person resets it here."""
    from datetime import UTC, datetime

    from gpumedic_store import breaker, views

    async def _breaker() -> str:
        async with views.store_session(store_url(args)) as session:
            if args.action == "reset":
                trips = await breaker.reset(session=session, by=args.by, now=datetime.now(UTC))
                await session.commit()
                return f"breaker reset by {args.by}" if trips else "the breaker was closed; nothing to reset"
            trip = await breaker.open_trip(session=session)
        if args.json:
            from gpumedic.output import to_json

            return to_json({"open": trip is not None, "since": trip.tripped_at if trip else None, "reason": trip.reason if trip else ""})
        if trip is None:
            return "breaker closed: the remediator may act"
        return f"breaker OPEN since {trip.tripped_at:%Y-%m-%d %H:%M:%S}Z: {trip.reason}\nreset it with: gpumedic breaker reset --by NAME"

    print(asyncio.run(_breaker()))
    return 0


def cmd_pause(args) -> int:
    """Stop every action fleet-wide (the breaker opened by a person); detection goes on."""
    from datetime import UTC, datetime

    from gpumedic_store import breaker, views

    async def _pause() -> tuple[str, int]:
        async with views.store_session(store_url(args)) as session:
            trip, new = await breaker.pause(session=session, reason=args.reason, by=args.by, now=datetime.now(UTC))
            await session.commit()
        if not new:
            return f"the breaker is already open since {trip.tripped_at:%Y-%m-%d %H:%M:%S}Z: {trip.reason}; no action runs", 1
        return (f"remediation paused by {args.by} ({args.reason}): no action runs on any node until `gpumedic resume --by NAME`; "
                "incidents are still opened and escalated"), 0

    said, code = asyncio.run(_pause())
    print(said)
    return code


def cmd_resume(args) -> int:
    """End a pause (or any open breaker): the remediator may act again."""
    from datetime import UTC, datetime

    from gpumedic_store import breaker, views

    async def _resume() -> str:
        async with views.store_session(store_url(args)) as session:
            trips = await breaker.reset(session=session, by=args.by, now=datetime.now(UTC))
            await session.commit()
        if not trips:
            return "nothing was paused; the remediator may act"
        return f"resumed by {args.by}: the remediator may act again (it was: {'; '.join(t.reason for t in trips)})"

    print(asyncio.run(_resume()))
    return 0


def cmd_dead_letters(args) -> int:
    """What the services refused, from the dead-letter stream (as the NATS admin); replay chosen ones."""
    from gpumedic import deadletters, operator_bus
    from gpumedic_bus.topology import ADMIN

    try:
        settings = operator_bus.operator_settings(args.var, ADMIN)
        if args.action == "list":
            print(asyncio.run(deadletters.dead_letters_text(settings, service=args.service, limit=args.limit, as_json=args.json)))
            return 0
        if not args.seq:
            print("gpumedic dead-letters: name the dead letters to replay by their SEQ (see `gpumedic dead-letters list`)", file=sys.stderr)
            return 2
        ok, lines = asyncio.run(deadletters.replay(settings, list(args.seq), store_url=store_url(args), by=args.by))
    except (operator_bus.OperatorError, NoStore) as exc:
        print(f"gpumedic dead-letters: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError, RuntimeError) as exc:
        print(f"gpumedic dead-letters: cannot reach the bus: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if ok else 1


command(
    "breaker", cmd_breaker, "show or reset the remediator's fleet circuit breaker",
    click.argument("action", type=click.Choice(["status", "reset"]), default="status", required=False),
    by_option(what="who resets it (kept in the audit log)"), var_option(), store_option(), json_option(),
)


command(
    "pause", cmd_pause, "stop every action fleet-wide, with a reason (a driver upgrade); detection goes on",
    click.option("--reason", required=True, help="why, shown on every console page, in `gpumedic report` and with every refusal"),
    by_option(what="who pauses (kept in the audit log)"), var_option(), store_option(),
    description="Opens the remediator's fleet circuit breaker on purpose: every action request is refused (recorded as blocked, "
    "its incident goes to a person) until `gpumedic resume`. The console shows it on every page, `gpumedic report` as a P1, "
    "and the remediator's gpumedic_breaker_open metric is 1. Exit 1 when the breaker was already open (kept as it was).",
)


command(
    "resume", cmd_resume, "end a pause: the remediator may act again (as `breaker reset`)",
    by_option(what="who resumes (kept in the audit log)"), var_option(), store_option(),
)


command(
    "dead-letters", cmd_dead_letters, "list what the services refused, and why; replay chosen ones once the cause is fixed",
    click.argument("action", type=click.Choice(["list", "replay"]), default="list", required=False),
    click.argument("seq", type=click.IntRange(min=1), nargs=-1),
    click.option("--service", type=click.Choice(list(SERVICES)), help="only what this service refused"),
    click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True, help="newest first, at most this many"),
    by_option(what="who replays (kept in the store with each replay)"), var_option(), store_option(), json_option(),
    description="Every message a service could not process (it did not decode, or its handler kept failing) is kept in "
    "the dead-letter stream with the reason and its payload. `replay SEQ...` delivers the original of chosen ones again, "
    "once the cause is fixed: only to a subject the refusing service's own consumer reads, only into that consumer's "
    "stream, only when the stream still holds the original the record describes (it is what is published), and each at "
    "most once (recorded in the store: who, when, what it became). Every consumer of that subject takes it as a "
    "redelivery. Reads and publishes as the NATS admin. Exit 0: done; 1: some not replayed; 2: the bus or the store "
    "could not be reached.",
)
