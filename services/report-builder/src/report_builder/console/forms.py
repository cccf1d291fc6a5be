"""What a request asks: its form (same origin only), the page to go back to, a window in hours, the node in the path, the first error."""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

from aiohttp import web

from gpumedic_events.base import is_subject_token


class BadRequest(Exception):
    """Bad input from the browser: a 400 page that says what was wrong."""


async def same_origin_form(request: web.Request):
    """The form of a write, refused when the browser says it comes from another origin."""
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    if origin:  # "null" too: a sandboxed or opaque origin is not this site
        parts = urlsplit(origin)
        if f"{parts.scheme}://{parts.netloc}" != f"{request.scheme}://{request.host}":
            raise web.HTTPForbidden(text=f"a write from another origin ({origin[:100]}) is refused")
    return await request.post()


def back_to(form, default: str, done: str) -> web.Response:
    """See other: back to the page the form was on (a path of this site only), saying what was done."""
    target = str(form.get("back") or default)
    if not console_path(target):
        target = default
    target = target.split("?")[0] if "done=" in target else target
    joiner = "&" if "?" in target else "?"
    return web.Response(status=303, headers={"Location": f"{target}{joiner}{urlencode({'done': done})}"})


def console_path(target: str) -> bool:
    """Whether `target` is a path of this console and nothing a browser could read as another site:
    browsers take `/\\host` and `\\\\host` as `//host`, and drop tabs and newlines inside a URL."""
    if not target.startswith("/") or any(c in target for c in "\\\t\r\n") or not target.isprintable():
        return False
    parts = urlsplit(target)
    return not target.startswith("//") and not parts.scheme and not parts.netloc


def first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "input"
        return f"{where}: {first.get('msg')}"
    return str(exc)


def hours_asked(request: web.Request, *, default: float) -> float:
    raw = request.query.get("hours") or str(default)
    try:
        hours = float(raw)
    except ValueError:
        raise BadRequest(f"hours must be a number, not {raw[:40]!r}") from None
    if not 0 < hours <= 24 * 90:
        raise BadRequest("hours must be above 0 and at most 90 days")
    return hours


def path_node(request: web.Request) -> str:
    node = request.match_info["node"]
    if not is_subject_token(node):
        raise BadRequest(f"{node[:80]!r} is not a node id (letters, digits, '-' and '_', at most 63)")
    return node
