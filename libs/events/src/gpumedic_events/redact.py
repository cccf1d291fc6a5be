"""Secrets masked out of other people's text: job command lines, container log lines, URLs.

gpumedic reports what runs on a node, and what runs there carries its owners' secrets:
`--password=...`, `AWS_SECRET_ACCESS_KEY=...`, `https://user:pw@host`, `Authorization: Bearer ...`,
cloud keys, JWTs, private keys. node-sampler masks them before a sample or event leaves the node;
every place that shows job text (the console and its saved pages, the CLI, webhooks, the store)
masks again, so text written before masking existed is masked too. Masking is idempotent (masked
text masks to itself), so the remediator compares a command line it reads on the node, masked the
same way, with the one the detector saw.

What is masked: the value of an option or variable whose name has a secret word in it
(`--api-key=...`, `--password ...`, `DB_PASSWORD=...`, `token: ...`, `"secret": "..."`, but not
`--tokenizer-path`); a URL's user info; bearer, basic and token credentials; AWS access key ids;
JWTs; PEM private key blocks (across lines: `redact_lines`); password hashes as crypt(3) writes
them (`/etc/shadow`'s `$6$salt$hash`); S3 presigned URLs' signatures; the token formats of common
services (GitHub, GitLab, Slack, Hugging Face, OpenAI, RunPod).
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Unicode's bidirectional controls (a regex class's body): text after U+202E reads right to left, so
a hostile name can show a person another command, path or id than the one it is (Trojan Source,
CVE-2021-42574)."""
CONTROLS = re.compile(f"[\x00-\x1f\x7f-\x9f{BIDI}]")
"""Every character a terminal or a page could obey: C0, DEL, C1 and the bidi controls."""

_SECRET_WORDS = frozenset(
    {"password", "passwd", "pwd", "pass", "secret", "token", "key", "apikey", "auth", "authorization",
     "credential", "credentials", "accesskey", "secretkey", "privatekey", "apitoken", "authtoken", "pat"}
)
"""Words of a name (split on - _ .) that make its value a secret: `--api-key`, `DB_PASSWORD`, but
not `--tokenizer-path`."""
_VALUE = r"""[^\s"'\\,;&]+"""
"""A value ends at a space or at what delimits it in JSON, shell quoting, a query or a list."""
_PROSE_WORDS = frozenset({"key", "auth", "pass", "pat"})
"""Secret words that prose uses too ("host key: changed", "auth: refused"): enough for `NAME=value`
and `--name value`, not for `name: value`."""
_OPTION = re.compile(rf"(?<![\w-])(--?[A-Za-z][\w.-]*)(=|\s+)({_VALUE})")
_ASSIGN = re.compile(rf"(?<![\w-])([A-Za-z][\w.-]*)(\s*=\s*)({_VALUE})")
_COLON = re.compile(rf"(?<![\w-])([A-Za-z][\w.-]*)(:\s*)(?!(?i:bearer|basic|token)\s)({_VALUE})")
_COMPOUNDS = ("apikey", "accesskey", "secretkey", "privatekey", "password", "passwd", "token", "secret")
_QUOTED = re.compile(r'"([A-Za-z][\w.-]*)"(\s*:\s*)"((?:[^"\\]|\\.)*)"')
"""`"name": "value"` in JSON text (a log line that prints a config)."""

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM private keys, whole (or to the end of a line that was cut)
    (
        re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|[^\"]*)", re.S),
        rf"-----BEGIN \1PRIVATE KEY----- {MASK} -----END \1PRIVATE KEY-----",
    ),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"'<>]+@"), rf"\g<1>{MASK}@"),
    (re.compile(r"(?i)\b((?:bearer|basic|token)\s+)(?!\*\*\*)[\w.~+/=-]{6,}"), rf"\g<1>{MASK}"),
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b"), MASK),
    (re.compile(r"\beyJ[\w-]{5,}\.[\w-]{5,}\.[\w-]*"), MASK),
    # crypt(3) hashes: MD5, bcrypt, SHA-256/512, yescrypt, gost-yescrypt, scrypt, argon2
    (re.compile(r"\$(?:1|2[abxy]?|5|6|y|gy|7|argon2(?:id|i|d))\$[./A-Za-z0-9$=,+-]{8,}"), MASK),
    # an S3 (SigV4) presigned URL's signature and credential
    (re.compile(r"(?i)([?&]X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s\"'<>]+"), rf"\g<1>{MASK}"),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}"
                r"|hf_[A-Za-z0-9]{20,}|sk-[\w-]{20,}|rpa_[A-Za-z0-9]{20,})"), MASK),
)


def secret_name(name: str, words: frozenset[str] = _SECRET_WORDS) -> bool:
    """Whether a name (an option, a variable, a key) says its value is a secret."""
    return any(part in words for part in re.split(r"[-_.]", name.lower().lstrip("-")))


def _hide_value(match: re.Match[str]) -> str:
    name, sep, value = match.groups()
    return f"{name}{sep}{MASK}" if secret_name(name) and value != MASK else match.group(0)


def _hide_labelled(match: re.Match[str]) -> str:
    name, sep, value = match.groups()
    joined = re.sub(r"[-_.]", "", name.lower())
    secret = secret_name(name, _SECRET_WORDS - _PROSE_WORDS) or any(word in joined for word in _COMPOUNDS)
    return f"{name}{sep}{MASK}" if secret and value != MASK else match.group(0)


def _hide_quoted(match: re.Match[str]) -> str:
    name, sep, value = match.groups()
    return f'"{name}"{sep}"{MASK}"' if secret_name(name) and value != MASK else match.group(0)


def redact(text: str) -> str:
    """`text` with every secret it shows replaced by `***`; the same text when it shows none."""
    if not text:
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    text = _QUOTED.sub(_hide_quoted, text)
    text = _OPTION.sub(_hide_value, text)
    text = _ASSIGN.sub(_hide_value, text)
    return _COLON.sub(_hide_labelled, text)


_BLOCK_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_BLOCK_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----")


def redact_lines(lines: list[str]) -> list[str]:
    """Lines of a log, each redacted, and a private key written over several lines masked whole: its
    BEGIN line masks the key, and every line after it up to its END line (or the last line, if the
    block never ends) is masked too (a per-line mask kept the key's body in clear)."""
    out, inside = [], False
    for line in lines:
        if inside:
            end = _BLOCK_END.search(line)
            if end is None:
                out.append(MASK)
                continue
            inside, line = False, line[end.end():]
        begin = _BLOCK_BEGIN.search(line)
        if begin is not None and _BLOCK_END.search(line, begin.end()) is None:
            inside = True
        out.append(redact(line))
    return out


def redact_tree(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with every string redacted, and the value of every
    key named like a secret masked whole."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {str(k): MASK if secret_name(str(k)) and _has_value(v) else redact_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    return value


def _has_value(value: Any) -> bool:
    """Whether there is something to hide (an empty or absent value is left as it is)."""
    return value not in (None, "", [], {})
