"""What is masked in other people's text (gpumedic_events.redact), case by case: what must go and
what must stay."""

from __future__ import annotations

import pytest

from gpumedic_events.redact import redact, redact_tree


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
        ("uploading with key AKIAIOSFODNN7EXAMPLE to s3", "to s3", "AKIAIOSFODNN7EXAMPLE"),
        ("token is eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln ok", " ok", "eyJzdWIiOiIxIn0"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY----- done", " done", "b3BlbnNzaC1rZXk"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA (cut)", "BEGIN RSA PRIVATE KEY", "MIIEpAIBAAKCAQEA"),
        ('config {"db_password": "p@ss w", "name": "x"}', '"name": "x"', "p@ss w"),
        ('curl -H "X-Api-Key: s3cr3t" https://api/?token=abc&x=1', "&x=1", "s3cr3t"),
        ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz1 python x", "python x", "hf_abcdef"),
        ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic", "dXNlcjpwYXNz"),
    ],
)
def test_credentials_in_command_lines_and_logs_are_hidden(text, kept, hidden):
    out = redact(text)
    assert hidden not in out and kept in out and "***" in out
    assert redact(out) == out  # idempotent: the remediator compares masked command lines


@pytest.mark.parametrize(
    "text",
    [
        "python train.py --epochs 90 --tokenizer-path /data/tok.json", "ssh -p 22 user@gpu-node-07", "XID 48 on GPU 0: pid=4123, name=python",
        "login refused: auth: refused; host key: changed", "GPU 0 at 0% for 600s while the node claims 1 job",
    ],
)
def test_text_without_credentials_is_unchanged(text):
    assert redact(text) == text


def test_a_tree_masks_every_string_and_every_value_named_like_a_secret():
    tree = {"command": "x --password=p1", "env": {"API_TOKEN": "t1", "empty_token": ""}, "pids": [4, 5], "lines": ["Bearer abcdefgh"]}
    assert redact_tree(tree) == {
        "command": "x --password=***", "env": {"API_TOKEN": "***", "empty_token": ""}, "pids": [4, 5], "lines": ["Bearer ***"],
    }


@pytest.mark.parametrize(
    ("text", "kept", "hidden"),
    [
        ("GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA/x&X-Amz-Signature=9f8e7d6c5b4a3f2e&part=2", "&part=2", "9f8e7d6c5b4a"),
        ("root:$6$Zq9x1Lm2$Yk0rVbQy3nP1x4uJc8sW2eT6gH9dF5aB:19700:0:99999:7:::", ":19700:0:99999", "Yk0rVbQy3nP1"),
        ("alice:$y$j9T$abcdefghijklmnop$0123456789ABCDEFGHIJ:19700::", "alice:", "0123456789ABCDEF"),
        ("bob:$2b$12$R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW", "bob:", "R9h/cIPz0gi"),
        ("connect postgresql://u@db/x?sslmode=require&password=hunter2 now", " now", "hunter2"),
    ],
)
def test_the_fourth_attacks_secrets_are_hidden(text, kept, hidden):
    out = redact(text)
    assert hidden not in out and kept in out and "***" in out
    assert redact(out) == out


def test_a_watch_rows_url_with_a_password_anywhere_is_refused_without_echoing_it():
    from pydantic import ValidationError

    from node_sampler.settings import Settings

    for entry in ("postgresql://u@db/x?password=SECRET:games", "postgresql://u@db/x?sslmode=require&sslpassword=SECRET:games",
                  "postgresql://u:SECRET@db/x:games"):
        with pytest.raises(ValidationError) as refused:
            Settings(watch_rows=[entry])
        assert "put no password in the URL" in str(refused.value) and "SECRET" not in str(refused.value)
