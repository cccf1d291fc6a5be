"""What a notification may carry and where it may go: redaction, and the channel settings."""

from __future__ import annotations

import pytest
from report_builder.notify import Channel, redact
from report_builder.settings import Settings


@pytest.mark.parametrize(
    ("text", "kept", "hidden"),
    [
        ("python train.py --api-key=sk-123 --epochs 3", "--epochs 3", "sk-123"),
        ("python train.py --token abc.def-ghi --lr 0.1", "--lr 0.1", "abc.def-ghi"),
        ("env WANDB_API_KEY=0123abcd python x.py", "python x.py", "0123abcd"),
        ("DB_PASSWORD: hunter2, retries: 3", "retries: 3", "hunter2"),
        ("pull https://deploy:glpat-xyz@gitlab.example.org/repo.git", "gitlab.example.org/repo.git", "glpat-xyz"),
        ("curl -H 'Authorization: Bearer eyJhbGciOi.x.y' http://svc", "http://svc", "eyJhbGciOi"),
        ("--aws-secret-access-key=AKIAXYZ", "--aws-secret-access-key=", "AKIAXYZ"),
    ],
)
def test_credentials_in_command_lines_and_logs_are_hidden(text, kept, hidden):
    out = redact(text)
    assert hidden not in out and kept in out and "***" in out


@pytest.mark.parametrize(
    "text",
    ["python train.py --epochs 90 --tokenizer-path /data/tok.json", "ssh -p 22 user@gpu-node-07", "XID 48 on GPU 0: pid=4123, name=python"],
)
def test_text_without_credentials_is_unchanged(text):
    assert redact(text) == text


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
