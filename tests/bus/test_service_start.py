"""How a service's console script starts and fails: one line naming what is wrong, never a
traceback; the log format and level from GPUMEDIC_LOG_*; JSON lines carry the trace id."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_bus import NatsSettings
from gpumedic_bus.service import CannotStart, describe_validation_error, wait_for_nats, warn_unknown_variables
from gpumedic_telemetry.logs import configure_logging
from zombie_detector.settings import Settings as DetectorSettings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(service: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEDIC_")}
    return subprocess.run([sys.executable, "-m", "gpumedic.cli", "run", service], env=clean | env,
                          capture_output=True, text=True, timeout=60)


def test_with_no_nats_server_a_service_says_so_in_one_line_and_exits():
    port = _closed_port()
    done = _run("zombie-detector", GPUMEDIC_NATS_URL=f"nats://127.0.0.1:{port}", GPUMEDIC_NATS_START_WAIT_S="1")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len(lines) <= 2, done.stderr  # the waiting line, then why it stopped
    assert lines[-1] == (f"gpumedic-zombie-detector: no NATS server answers at nats://127.0.0.1:{port} (connection refused) "
                         "after 1s; start one (`gpumedic up` runs the whole stack) or set GPUMEDIC_NATS_URL")


def test_a_setting_that_does_not_parse_is_named_by_its_variable():
    done = _run("leader-health", GPUMEDIC_NATS_PING_INTERVAL_S="often", GPUMEDIC_LOG_LEVEL="warning")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("gpumedic-leader-health: bad settings: GPUMEDIC_NATS_PING_INTERVAL_S: Input should be a "
                                   "valid integer, unable to parse string as an integer (got 'often')")


def test_a_bad_log_level_or_format_is_refused_by_name():
    done = _run("autoscaler", GPUMEDIC_LOG_FORMAT="xml")
    assert done.returncode == 1
    assert done.stderr.strip() == "gpumedic-autoscaler: GPUMEDIC_LOG_FORMAT='xml' is not a format; use text or json"


def test_an_instance_id_that_is_not_a_uuid_is_refused_by_name():
    done = _run("zombie-detector", GPUMEDIC_INSTANCE_ID="detector-1")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("GPUMEDIC_INSTANCE_ID='detector-1' is not a UUID")


class _Secrets(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TEST_SVC_")
    api_token: int = 0
    retries: int = 0


def test_a_bad_secret_is_named_but_its_value_never_shown(monkeypatch):
    monkeypatch.setenv("TEST_SVC_API_TOKEN", "s3cret-value")
    monkeypatch.setenv("TEST_SVC_RETRIES", "many")
    with pytest.raises(ValidationError) as bad:
        _Secrets()
    text = describe_validation_error(bad.value, _Secrets)
    assert "TEST_SVC_API_TOKEN: Input should be a valid integer" in text and "s3cret-value" not in text
    assert "TEST_SVC_RETRIES: Input should be a valid integer, unable to parse string as an integer (got 'many')" in text


def test_a_misspelt_variable_of_the_service_is_warned_about_and_composed_ones_are_not(caplog):
    environ = {"GPUMEDIC_DETECTOR_IDLE_FOR_S": "30", "GPUMEDIC_DETECTOR_TRACE_TO_BUS": "true", "GPUMEDIC_NATS_URL": "x"}
    with caplog.at_level(logging.WARNING):
        assert warn_unknown_variables(DetectorSettings, environ) == ["GPUMEDIC_DETECTOR_IDLE_FOR_S"]
    assert "GPUMEDIC_DETECTOR_IDLE_FOR_S is not a setting of this service" in caplog.text
    assert "policy file" in caplog.text


@pytest.fixture
def root_logger():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, {n: logging.getLogger(n).level for n in ("httpx", "httpcore")})
    yield root
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def test_json_lines_carry_the_service_the_level_and_the_current_trace(root_logger, capsys):
    configure_logging("zombie-detector", {"GPUMEDIC_LOG_FORMAT": "json", "GPUMEDIC_LOG_LEVEL": "debug"})
    assert root_logger.level == logging.DEBUG
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("incident") as span:
        logging.getLogger("zombie_detector.rules").info("opened %s", "gpu-node-07/zombie_job/0")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("x").exception("failed")
    first, second = (json.loads(line) for line in capsys.readouterr().err.strip().splitlines())
    assert first["message"] == "opened gpu-node-07/zombie_job/0" and first["level"] == "INFO"
    assert first["service"] == "zombie-detector" and first["logger"] == "zombie_detector.rules"
    assert first["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert "trace_id" not in second and "RuntimeError: boom" in second["exception"]


def test_text_lines_are_the_default_and_the_level_filters(root_logger, capsys):
    configure_logging("x", {"GPUMEDIC_LOG_LEVEL": "WARNING"})
    logging.getLogger("a").info("quiet")
    logging.getLogger("a").warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and err.rstrip().endswith("WARNING a: loud")


async def test_a_webhook_url_never_reaches_the_log_even_at_debug(root_logger, capsys):
    """httpx logs each request's whole URL at INFO; a Slack webhook's URL is its credential."""
    import httpx

    configure_logging("report-builder", {"GPUMEDIC_LOG_LEVEL": "DEBUG"})
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404))) as client:
        await client.post("https://hooks.slack.example/services/T000/B000/s3cr3t-path", json={})
    logging.getLogger("report_builder.notify").error("notification failed: hooks.slack.example answered HTTP 404")
    err = capsys.readouterr().err
    assert "answered HTTP 404" in err and "s3cr3t" not in err


async def test_a_reachable_server_is_waited_for_and_a_dead_one_gives_up_after_the_wait(nats_url):
    await wait_for_nats(NatsSettings(url=nats_url), "test")
    with pytest.raises(CannotStart, match="no NATS server answers at nats://127.0.0.1:.* after 0s"):
        await wait_for_nats(NatsSettings(url=f"nats://127.0.0.1:{_closed_port()}", start_wait_s=0), "test")


async def test_sigusr1_logs_where_each_task_waits(caplog):
    """A service that will not stop is asked for this before it is killed: its log names the
    coroutine each task waits in."""
    from gpumedic_bus.service import log_task_stacks

    async def waits_for_the_store_forever(never: asyncio.Event) -> None:
        await never.wait()

    stuck = asyncio.create_task(waits_for_the_store_forever(asyncio.Event()), name="stuck-handler")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="gpumedic_bus.service"):
        log_task_stacks()
    stuck.cancel()
    (line,) = [r.getMessage() for r in caplog.records if "stuck-handler" in r.getMessage()]
    assert "waits_for_the_store_forever" in line and "never.wait()" in line
