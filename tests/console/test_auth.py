"""Who may act from the console: the token, a name, the session and its CSRF token."""

from __future__ import annotations

import pytest

from report_builder.console.auth import AuthError, Sessions

TOKEN = "a-console-token-of-enough-length"


def test_without_a_token_the_console_is_read_only():
    sessions = Sessions(None)
    assert not sessions.writable
    with pytest.raises(AuthError, match="read-only"):
        sessions.login("anything", "alice")


def test_a_session_needs_the_token_and_a_plain_name():
    sessions = Sessions(TOKEN)
    with pytest.raises(AuthError, match="wrong token"):
        sessions.login("guess", "alice")
    for name in ("", "<script>", "a" * 64, "alice\nbob"):
        with pytest.raises(AuthError, match="give your name"):
            sessions.login(TOKEN, name)
    session_id, session = sessions.login(TOKEN, "  alice@ops ")
    assert session.name == "alice@ops" and sessions.get(session_id) == session


def test_a_write_needs_the_session_and_its_own_csrf_token():
    sessions = Sessions(TOKEN)
    alice_id, alice = sessions.login(TOKEN, "alice")
    _, bob = sessions.login(TOKEN, "bob")
    assert sessions.authorize(alice_id, alice.csrf) == alice
    with pytest.raises(AuthError, match="CSRF"):
        sessions.authorize(alice_id, bob.csrf)
    with pytest.raises(AuthError, match="CSRF"):
        sessions.authorize(alice_id, None)
    with pytest.raises(AuthError, match="log in"):
        sessions.authorize("made-up", alice.csrf)
    sessions.logout(alice_id)
    with pytest.raises(AuthError, match="log in"):
        sessions.authorize(alice_id, alice.csrf)


def test_sessions_end_after_their_time():
    now = [1000.0]
    sessions = Sessions(TOKEN, ttl_s=60, clock=lambda: now[0])
    session_id, session = sessions.login(TOKEN, "alice")
    now[0] += 59
    assert sessions.authorize(session_id, session.csrf) == session
    now[0] += 2
    with pytest.raises(AuthError, match="log in"):
        sessions.authorize(session_id, session.csrf)
