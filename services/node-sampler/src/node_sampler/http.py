"""The sampler's HTTP, through httpx: a node's status endpoint over TCP, the Docker engine over
its unix socket. httpx (with what it imports) costs the process about 8 MB, so it is imported
only when a client is made: a node with neither a status endpoint nor a Docker engine never
pays for it.

The callers see no httpx exception: a connection that cannot be made raises the OSError under
it (FileNotFoundError, ConnectionRefusedError, PermissionError: the caller tells a missing
engine from a forbidden one), a timeout raises TimeoutError, and anything else the caller's own
`error` class, saying what was wrong with the answer.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx



def client(*, socket_path: str | None = None, headers: Mapping[str, str] | None = None) -> httpx.AsyncClient:
    """A client with no deadline of its own (each caller bounds its requests; an event stream may
    idle for hours), no proxy or netrc from the environment, redirects not followed."""
    import httpx  # here, not at the top: see the module's docstring

    transport = httpx.AsyncHTTPTransport(uds=socket_path, verify=_tls()) if socket_path else None
    return httpx.AsyncClient(
        transport=transport, verify=_tls(), timeout=None, trust_env=False, follow_redirects=False, headers=dict(headers or {})
    )


@functools.cache
def _tls() -> ssl.SSLContext:
    """One verifying TLS context for every client (an https status URL): each made its own, and a
    simulated fleet of 200 nodes in one process paid 200 certificate stores."""
    return ssl.create_default_context()


@contextlib.asynccontextmanager
async def stream(http: httpx.AsyncClient, url: str, *, error: type[Exception]) -> AsyncIterator[tuple[int, Mapping[str, str], AsyncIterator[bytes]]]:
    """(status, headers, the body's pieces as they arrive) of one GET."""
    import httpx

    try:
        async with http.stream("GET", url) as answer:
            yield answer.status_code, answer.headers, _pieces(answer, error)
    except httpx.HTTPError as exc:
        raise _plain(exc, error) from None


async def get(http: httpx.AsyncClient, url: str, *, max_bytes: int, error: type[Exception]) -> tuple[int, Mapping[str, str], bytes]:
    """(status, headers, body) of one GET; `error` if the body is larger than `max_bytes`."""
    async with stream(http, url, error=error) as (status, headers, pieces):
        body = bytearray()
        async for piece in pieces:
            body += piece
            if len(body) > max_bytes:
                raise error(f"answer larger than {max_bytes} bytes")
        return status, headers, bytes(body)


async def _pieces(answer: httpx.Response, error: type[Exception]) -> AsyncIterator[bytes]:
    import httpx

    try:
        # as they arrive: with a chunk size, httpx holds pieces back until one is full
        async for piece in answer.aiter_bytes():
            yield piece
    except httpx.HTTPError as exc:
        raise _plain(exc, error) from None


def _plain(exc: Exception, error: type[Exception]) -> Exception:
    """What an httpx error means to the caller (see the module's docstring)."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return TimeoutError(str(exc) or "no answer in time")
    if isinstance(exc, httpx.ConnectError):
        cause: Any = exc
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            return cause
    if isinstance(exc, httpx.RemoteProtocolError):
        return error(f"not an HTTP answer, or one cut short ({str(exc)[:80]})")
    return error(f"{type(exc).__name__}: {str(exc)[:120]}" if str(exc) else type(exc).__name__)
