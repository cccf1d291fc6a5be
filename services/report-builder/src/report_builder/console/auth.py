"""Who may change something from the console: a person who typed the console's token.

Without a token configured the console is read-only and offers no operation. With one, a person
logs in with the token and a name (the `by` of what they do); the console keeps the session in
memory (a random id in an HttpOnly, SameSite=Strict cookie) with its own CSRF token, which every
form carries back. A write needs both, and a same-origin request: a page elsewhere can neither
read the CSRF token nor send the cookie. Sessions end after `ttl_s` or at logout, and with the
process (a restart asks everyone to log in again).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import hmac
import re
import secrets

SESSION_COOKIE = "gpumedic_console"
LOGIN_COOKIE = "gpumedic_console_login"
"""The login form's own double-submit value: a page elsewhere cannot log a browser in as someone."""
NAME = re.compile(r"^[\w.@+-][\w .@+-]{0,62}$")
"""A person's name as the audit keeps it: letters, digits, space, `.@+-_`."""


class AuthError(Exception):
    """A write was refused; the message says why (never echoing a secret)."""


@dataclass(frozen=True)
class Session:
    name: str
    csrf: str
    expires: float


class Sessions:
    def __init__(self, token: str | None, *, ttl_s: float = 12 * 3600.0, clock=time.monotonic) -> None:
        self._token = token
        self._ttl = ttl_s
        self._clock = clock
        self._by_id: dict[str, Session] = {}

    @property
    def writable(self) -> bool:
        """Whether operations can be offered at all (a token is configured)."""
        return self._token is not None

    def login(self, token: str, name: str) -> tuple[str, Session]:
        """A new session for the right token; AuthError otherwise."""
        if self._token is None:
            raise AuthError("the console is read-only: no token is configured (GPUMEDIC_REPORTS_CONSOLE_TOKEN_FILE)")
        if not hmac.compare_digest(token.encode(), self._token.encode()):
            raise AuthError("wrong token")
        name = name.strip()
        if not NAME.fullmatch(name):
            raise AuthError("give your name (1 to 63 letters, digits, spaces or .@+-_): it is kept with what you do")
        self._forget_expired()
        session_id = secrets.token_urlsafe(32)
        session = Session(name=name, csrf=secrets.token_urlsafe(32), expires=self._clock() + self._ttl)
        self._by_id[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of this cookie value, if any."""
        session = self._by_id.get(session_id or "")
        if session is None or session.expires <= self._clock():
            return None
        return session

    def authorize(self, session_id: str | None, csrf: str | None) -> Session:
        """The session a write comes from; AuthError unless the cookie and the form's token match."""
        session = self.get(session_id)
        if session is None:
            raise AuthError("log in with the console's token first (or again: sessions end after 12 hours and at a restart)")
        if not csrf or not hmac.compare_digest(csrf.encode(), session.csrf.encode()):
            raise AuthError("the form's CSRF token does not match this session; reload the page and try again")
        return session

    def logout(self, session_id: str | None) -> None:
        self._by_id.pop(session_id or "", None)

    def _forget_expired(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._by_id.items() if s.expires <= now]:
            del self._by_id[key]


class LoginThrottle:
    """How fast tokens may be guessed. Each address may try `per_client` tokens within `window_s`
    (an attempt counts when it starts, so many at once from one address are held like many in a
    row); past that it is refused without its token being looked at. Across all addresses, wrong
    tokens are slowed, never refused: past `in_total` wrong tokens within the window each wrong
    answer waits `flood_delay_s` instead of `delay_s`. So strangers guessing from many addresses
    cannot lock the operator out: the right token is checked (in constant time) and let in
    whatever the others did. A successful login forgets its address's attempts."""

    MAX_CLIENTS = 10_000
    """Addresses remembered at most (the oldest are forgotten first): bounded memory under a flood."""

    def __init__(self, *, per_client: int = 5, in_total: int = 30, window_s: float = 60.0, delay_s: float = 0.5,
                 flood_delay_s: float = 5.0, clock=time.monotonic) -> None:
        self._per_client = per_client
        self._in_total = in_total
        self._window_s = window_s
        self._delay_s = delay_s
        self._flood_delay_s = flood_delay_s
        self._clock = clock
        self._wrong: deque[float] = deque()
        self._by_client: dict[str, deque[float]] = {}

    def admit(self, client: str) -> float:
        """0 when `client` may try a token now (and the try is counted), else the seconds to wait."""
        now = self._clock()
        since = now - self._window_s
        tries = self._by_client.get(client, deque())
        while tries and tries[0] <= since:
            tries.popleft()
        if len(tries) >= self._per_client:
            return tries[0] + self._window_s - now
        tries.append(now)
        self._by_client.pop(client, None)
        self._by_client[client] = tries  # the most recent last
        if len(self._by_client) > self.MAX_CLIENTS:
            del self._by_client[next(iter(self._by_client))]
        return 0.0

    def wrong(self) -> float:
        """Count a wrong token; the seconds its answer waits (longer while many come from everywhere)."""
        now = self._clock()
        while self._wrong and self._wrong[0] <= now - self._window_s:
            self._wrong.popleft()
        self._wrong.append(now)
        return self._flood_delay_s if len(self._wrong) > self._in_total else self._delay_s

    def succeeded(self, client: str) -> None:
        self._by_client.pop(client, None)
