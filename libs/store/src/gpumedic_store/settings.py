"""Where the incident store lives, read once from GPUMEDIC_STORE_* variables.

The URL may carry a password (PostgreSQL deployments); `safe_url` is the only form of it that
may reach a log line, an error message or a report.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

DEFAULT_URL = "sqlite+aiosqlite:///var/gpumedic.db"

ASYNC_DRIVERS = {"postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}
"""A plain URL's driver, and the asyncio driver used for it (installed with the store)."""

_MASK = "***"
_SECRET_QUERY_KEYS = ("password", "passwd", "pwd", "secret", "token", "sslpassword")
_USERINFO = re.compile(r"(?P<head>://[^:/@?#]*:)(?P<secret>[^@/?#]*)@")


class StoreSettings(BaseSettings):
    """How to reach the incident store. Read from GPUMEDIC_STORE_* variables."""

    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_STORE_", extra="ignore")

    url: str = Field(
        default=DEFAULT_URL,
        description="SQLAlchemy async URL: a SQLite file (embedded mode, the default) or "
        "postgresql+asyncpg://user:password@host:port/db for real deployments.",
    )

    @field_validator("url")
    @classmethod
    def _async_driver(cls, url: str) -> str:
        return async_url(url)

    @property
    def safe_url(self) -> str:
        """The URL with any password masked: the only form that may be logged."""
        return mask_url(self.url)


def async_url(url: str) -> str:
    """`url` with a plain driver (sqlite://, postgresql://) swapped for its asyncio one; the rest as given."""
    scheme, sep, rest = url.partition("://")
    return f"{ASYNC_DRIVERS[scheme]}{sep}{rest}" if sep and scheme in ASYNC_DRIVERS else url


def mask_url(url: str) -> str:
    """`url` with the password (in the user part or in the query) replaced by ***."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        # Not a URL SQLAlchemy understands; mask what looks like user:password@ anyway.
        return _USERINFO.sub(lambda m: f"{m['head']}{_MASK}@", url)
    if parsed.query:
        parsed = parsed.update_query_dict(
            {k: _MASK for k in parsed.query if k.lower() in _SECRET_QUERY_KEYS}, append=False
        )
    return parsed.render_as_string(hide_password=True)


def url_secrets(url: str) -> list[str]:
    """The secret strings a URL carries, so error texts from drivers can be scrubbed of them."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        match = _USERINFO.search(url)
        return [match["secret"]] if match and match["secret"] else []
    found = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if key.lower() in _SECRET_QUERY_KEYS:
            found.extend([value] if isinstance(value, str) else list(value))
    return [str(s) for s in found if s]
