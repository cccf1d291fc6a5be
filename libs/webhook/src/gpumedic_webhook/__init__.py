"""POST JSON to an endpoint someone else runs: an escalation channel, a scheduler's drain hook.

A round retries transient failures (connection errors, timeouts, 408, 425, 429, 5xx) with
exponential back-off and jitter (tenacity); a 4xx means the endpoint refuses this request and
fails at once. The URL (for Slack, the secret itself) and the bearer token never reach an error,
a log line or a payload: errors name the host only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter


class DeliveryError(Exception):
    """A POST that did not reach the receiver; `transient` ones are worth retrying."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def read_token(path: Path, setting: str) -> str:
    """The bearer token in `path` (surrounding whitespace dropped); ValueError names the setting and
    the file, never what is in it."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"{setting} {path}: {exc.strerror or type(exc).__name__}") from None
    if not token:
        raise ValueError(f"{setting} {path} is empty")
    return token


def host_of(url: str) -> str:
    """The only part of a URL that may be shown."""
    return urlsplit(url).hostname or "?"


async def post(client: httpx.AsyncClient, url: str, body: dict[str, Any] | list[Any], *, token: str | None = None) -> None:
    """One POST; raises DeliveryError (naming the host, never the URL) unless the receiver took it."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    host = host_of(url)
    try:
        response = await client.post(url, json=body, headers=headers)
    except httpx.TimeoutException:
        raise DeliveryError(f"{host} did not answer in time", transient=True) from None
    except httpx.HTTPError as exc:
        # httpx's message may carry the URL; the exception's type does not.
        raise DeliveryError(f"{host} unreachable ({type(exc).__name__})", transient=True) from None
    if response.is_success:
        return
    status = response.status_code
    raise DeliveryError(f"{host} answered HTTP {status}", transient=status in (408, 425, 429) or status >= 500)


async def post_with_retries(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    token: str | None = None,
    tries: int = 3,
    initial_s: float = 0.5,
) -> None:
    """`post`, retried on transient failures; raises the last DeliveryError."""
    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(tries),
        wait=wait_exponential_jitter(multiplier=initial_s, max=5, jitter=initial_s),
        retry=retry_if_exception(lambda exc: isinstance(exc, DeliveryError) and exc.transient),
        reraise=True,
    ):
        with attempt:
            await post(client, url, body, token=token)


__all__ = ["DeliveryError", "host_of", "post", "post_with_retries", "read_token"]
