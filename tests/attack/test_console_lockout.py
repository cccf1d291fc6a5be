"""Strangers cannot lock the operator out of the console: seven loopback addresses sent five wrong
tokens each, the total limit (30 a minute) was checked before the token, and the operator's right
token got 429 for a minute. Each address is still held to its own five tries; across addresses
wrong tokens are slowed, never refused, and the right token is let in. On the real console over
real HTTP, each client from its own loopback address."""

from __future__ import annotations

import asyncio

import httpx

from tests.console.test_http import TOKEN, Browser, browser, console, store  # noqa: F401


def _from(console, address: str) -> httpx.AsyncClient:  # noqa: F811
    return httpx.AsyncClient(base_url=console.url, follow_redirects=False, timeout=30,
                             transport=httpx.AsyncHTTPTransport(local_address=address))


async def test_strangers_guessing_from_seven_addresses_do_not_lock_the_operator_out(console):  # noqa: F811
    async def guesses(address: str) -> list[int]:
        async with _from(console, address) as client:
            stranger = Browser(client)
            check = await stranger.hidden("/", "login_check")
            answers = await asyncio.gather(*(
                client.post("/login", data={"login_check": check, "token": f"guess-{address}-{n}", "name": "mallory"}) for n in range(6)
            ))
            return [a.status_code for a in answers]

    statuses = await asyncio.gather(*(guesses(f"127.0.0.{n}") for n in range(2, 9)))
    for address_statuses in statuses:  # each address: five tries, the sixth held
        assert sorted(address_statuses) == [403] * 5 + [429], statuses
    async with _from(console, "127.0.0.9") as client:
        operator = Browser(client)
        answer = await operator.login()
        assert answer.status_code == 303, answer.text
        assert "alice" in (await client.get("/ledger")).text
