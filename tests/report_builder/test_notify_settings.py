"""Where a notification may go: the channel settings (what it may carry: tests/attack/test_redact.py)."""

from __future__ import annotations

import pytest
from report_builder.notify import Channel
from report_builder.settings import Settings


def test_a_channel_never_shows_its_url_or_token():
    channel = Channel("slack", "slack", "https://hooks.slack.com/services/T0/B0/XXSECRET", "tok")
    assert "XXSECRET" not in repr(channel) and "tok'" not in repr(channel) and channel.host == "hooks.slack.com"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://hooks.example.org/x", "must use https://"),
        ("ftp://hooks.example.org/x", "must be an https:// URL"),
        ("https://hooks.example.org/change-me", "still holds a placeholder"),
    ],
)
def test_a_webhook_url_that_would_leak_or_is_a_placeholder_is_refused_without_quoting_it(monkeypatch, url, message):
    monkeypatch.setenv("GPUMEDIC_REPORTS_SLACK_WEBHOOK_URL", url)
    with pytest.raises(ValueError, match=f"GPUMEDIC_REPORTS_SLACK_WEBHOOK_URL {message}") as info:
        Settings().channels()
    assert "hooks.example.org" not in str(info.value)


def test_channels_come_from_the_settings_with_the_token_file(monkeypatch, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.setenv("GPUMEDIC_REPORTS_WEBHOOK_URL", "https://ops.example.org/secret-gpumedic-hook")
    monkeypatch.setenv("GPUMEDIC_REPORTS_WEBHOOK_TOKEN_FILE", str(token))
    monkeypatch.setenv("GPUMEDIC_REPORTS_SLACK_WEBHOOK_URL", "http://127.0.0.1:9/hook")
    settings = Settings()
    assert [(c.name, c.format, c.token) for c in settings.channels()] == [("webhook", "json", "s3cret"), ("slack", "slack", None)]
    assert "secret-gpumedic-hook" not in repr(settings)  # and "secret" in a real path is no placeholder
    token.unlink()
    with pytest.raises(ValueError, match=r"GPUMEDIC_REPORTS_WEBHOOK_TOKEN_FILE .*token: No such file"):
        settings.channels()


def test_no_channel_no_notifier():
    assert Settings().channels() == []


def test_empty_values_from_compose_mean_unset(monkeypatch):
    for name in ("WEBHOOK_URL", "SLACK_WEBHOOK_URL", "CONSOLE_URL", "WEBHOOK_TOKEN_FILE"):
        monkeypatch.setenv(f"GPUMEDIC_REPORTS_{name}", "")
    settings = Settings()
    assert settings.channels() == [] and settings.console_url is None


def test_alertmanagers_are_a_comma_separated_list_and_a_bad_one_is_refused_without_quoting_it(monkeypatch):
    monkeypatch.setenv("GPUMEDIC_REPORTS_ALERTMANAGER_URL", " http://am-1:9093/ ,https://am-2.example:9093")
    assert Settings().alertmanagers() == ["http://am-1:9093/", "https://am-2.example:9093"]
    monkeypatch.setenv("GPUMEDIC_REPORTS_ALERTMANAGER_URL", "http://am-1:9093,ftp://alice:s3cret@am-2")
    with pytest.raises(ValueError, match="entry 2 of 2 is not an http") as refused:
        Settings().alertmanagers()
    assert "s3cret" not in str(refused.value)
    monkeypatch.setenv("GPUMEDIC_REPORTS_ALERTMANAGER_URL", "")
    assert Settings().alertmanagers() == []
