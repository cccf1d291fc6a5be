"""How every service's console script starts: `run_service`.

A service that cannot start says why in one line and exits with status 1, never with a traceback:
a setting that does not parse (named by its environment variable), a policy or file that is wrong
(the service's own check says which), a NATS server that does not answer within
`GPUMEDIC_NATS_START_WAIT_S` or refuses the login. A GPUMEDIC_* variable with the service's
prefix that names no setting is logged as a warning, so a misspelt threshold is not silently the
default.
"""

from __future__ import annotations

import asyncio
import logging
import io
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from faststream import FastStream
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings

from gpumedic_bus.outage import nats_reason
from gpumedic_bus.connect import connect
from gpumedic_bus.settings import NatsSettings
from gpumedic_telemetry.logs import configure_logging

log = logging.getLogger(__name__)

S = TypeVar("S", bound=BaseSettings)
_SECRET_WORDS = ("password", "secret", "token", "key")


class CannotStart(Exception):
    """Why a service will not start, in one line."""


def run_service(service: str, settings_class: type[S], build: Callable[[S], FastStream]) -> None:
    """Console script body: settings from the environment, `build` (which may raise ValueError for a
    bad policy or file), NATS reachable, then the app until SIGINT or SIGTERM."""
    name = f"gpumedic-{service}"
    try:
        configure_logging(service)
        settings = settings_class()
        warn_unknown_variables(settings_class, os.environ)
        app = build(settings)
    except ValidationError as exc:
        sys.exit(f"{name}: bad settings: {describe_validation_error(exc, settings_class)}")
    except ValueError as exc:
        sys.exit(f"{name}: {exc}")

    async def _main() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, log_task_stacks)
        await wait_for_nats(settings.nats, service)
        await app.run()  # FastStream turns SIGINT and SIGTERM into a graceful stop

    try:
        asyncio.run(_main())
    except CannotStart as exc:
        sys.exit(f"{name}: {exc}")
    except KeyboardInterrupt:
        pass


def log_task_stacks() -> None:
    """SIGUSR1: log where every task of the service waits (a stop that hangs is killed after this,
    so its log says what it was waiting for)."""
    for task in asyncio.all_tasks():
        out = io.StringIO()
        task.print_stack(limit=12, file=out)
        log.warning("task %s: %s", task.get_name(), out.getvalue().strip())


async def wait_for_nats(settings: NatsSettings, service: str) -> None:
    """Connect once with the service's own credentials, retrying for `start_wait_s`; CannotStart
    says what the server (or the network) answered. A login refused is not retried."""
    where = ", ".join(settings.servers)
    deadline = time.monotonic() + settings.start_wait_s
    said = False
    while True:
        seen: list[Exception] = []

        async def remember(exc: Exception) -> None:  # instead of nats-py's traceback per attempt
            seen.append(exc)

        try:
            # nats-py tries a server until it has failed more than max_reconnect_attempts times (0: forever).
            nc = await connect(settings, f"{service}-start", allow_reconnect=False, connect_timeout=2,
                               max_reconnect_attempts=1, reconnect_time_wait=0.2, error_cb=remember)
        except Exception as exc:  # nats-py raises OSError, TimeoutError or its own errors
            reason = nats_reason(seen[-1] if seen else exc)
            if "authorization" in reason.lower():
                raise CannotStart(f"NATS at {where} refused the login of user {settings.user!r}: {reason}; "
                                  "check GPUMEDIC_NATS_USER and GPUMEDIC_NATS_PASSWORD (`gpumedic init` writes them)") from None
            if time.monotonic() >= deadline:
                raise CannotStart(f"no NATS server answers at {where} ({reason}) after {settings.start_wait_s:g}s; "
                                  "start one (`gpumedic up` runs the whole stack) or set GPUMEDIC_NATS_URL") from None
            if not said:
                log.warning("%s: waiting up to %gs for NATS at %s: %s", service, settings.start_wait_s, where, reason)
                said = True
            await asyncio.sleep(1.0)
            continue
        await nc.close()
        return


def _prefixes(settings_class: type[BaseModel]) -> dict[str, str]:
    """Model name -> environment prefix, for the settings class and the settings it composes."""
    out = {settings_class.__name__: settings_class.model_config.get("env_prefix", "")}
    for field in settings_class.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings):
            out[field.annotation.__name__] = field.annotation.model_config.get("env_prefix", "")
    return out


def describe_validation_error(exc: ValidationError, settings_class: type[BaseModel]) -> str:
    """Each error as `VARIABLE: what is wrong (got 'value')`; a secret's value is never shown."""
    prefix = _prefixes(settings_class).get(exc.title, "")
    parts = []
    for error in exc.errors():
        loc = "_".join(str(p) for p in error["loc"])
        where = f"{prefix}{loc}".upper() if loc else exc.title
        text = f"{where}: {error['msg']}"
        value = error.get("input")
        if loc and isinstance(value, str | int | float) and not any(w in loc.lower() for w in _SECRET_WORDS):
            text += f" (got {value!r})"
        parts.append(text)
    return "; ".join(parts)


def warn_unknown_variables(settings_class: type[BaseModel], environ) -> list[str]:
    """GPUMEDIC_* variables with the service's prefix that name no setting (logged; returned for tests)."""
    prefix = settings_class.model_config.get("env_prefix", "")
    if not prefix:
        return []
    known = set()
    for name, field in settings_class.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings):
            continue  # composed settings read their own prefix (GPUMEDIC_NATS_*, ...)
        known.add(f"{prefix}{name}".upper())
        for alias in (field.alias, field.validation_alias):
            if isinstance(alias, str):
                known.add(alias.upper())
    unknown = sorted(k for k in environ if k.upper().startswith(prefix) and k.upper() not in known)
    where = "; thresholds and ladders are in the policy file (`gpumedic policy`)" if "policy" in settings_class.model_fields else ""
    for variable in unknown:
        log.warning("%s is not a setting of this service and is ignored (its settings: %s%s)", variable,
                    ", ".join(sorted(known)), where)
    return unknown
