"""The console's settings: off unless a port is set, its token read from a file and long enough."""

from __future__ import annotations

import pytest

from report_builder.settings import Settings


def test_no_port_no_console_and_no_token_file_read_only(monkeypatch):
    for name in ("GPUMEDIC_REPORTS_CONSOLE_PORT", "GPUMEDIC_REPORTS_CONSOLE_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.console_port is None and settings.console_token() is None
    monkeypatch.setenv("GPUMEDIC_REPORTS_CONSOLE_PORT", "")  # compose's `${VAR:-}`
    assert Settings().console_port is None


def test_the_token_comes_from_its_file_and_a_short_one_stops_the_start(tmp_path, monkeypatch):
    token = tmp_path / "console-token"
    token.write_text("short\n")
    monkeypatch.setenv("GPUMEDIC_REPORTS_CONSOLE_TOKEN_FILE", str(token))
    with pytest.raises(ValueError, match="holds a token of 5 characters; use 16 or more") as caught:
        Settings().console_token()
    assert "short" not in str(caught.value)
    token.write_text("a-token-long-enough-for-the-console\n")
    assert Settings().console_token() == "a-token-long-enough-for-the-console"
    token.unlink()
    with pytest.raises(ValueError, match="GPUMEDIC_REPORTS_CONSOLE_TOKEN_FILE .*console-token"):
        Settings().console_token()


def test_the_jaeger_link_must_be_a_web_address(monkeypatch):
    monkeypatch.setenv("GPUMEDIC_REPORTS_JAEGER_URL", "javascript:alert(1)")
    with pytest.raises(ValueError, match="GPUMEDIC_REPORTS_JAEGER_URL must be an http"):
        Settings()
