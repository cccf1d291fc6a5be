"""Running catalogue commands on a node over SSH, with the node's host key always verified.

One connection per action, reused for all of its commands; a node behind a jump host is reached
through an SSH tunnel from that host (OpenSSH's ProxyJump), both logins with the node's key. Host
keys, the jump host's too, are checked against the configured known_hosts file on every connection (a node whose key is not in it is refused:
an impostor must never receive commands; host-key checking is never turned off here). Only the
configured client key is offered: no agent, no ~/.ssh/config, no password. Every failure
becomes a `NodeError` naming node, host, port and cause, which the handler turns into a failed
outcome; no key material ever reaches an error, a log line or an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NamedTuple

import asyncssh

from gpumedic_nodes.inventory import NodeAddress, address_of

log = logging.getLogger(__name__)


class CommandResult(NamedTuple):
    """One command's exit status and output; a non-zero status is a result, not an error."""

    exit_status: int
    stdout: str
    stderr: str


class NodeError(Exception):
    """A node could not be reached or could not run a command. `code` says why in one word
    (NodeSshChecked's causes): refused, timeout, auth_refused, host_key_changed, unreachable."""

    code = "unreachable"

    def __init__(self, node_id: str, address: NodeAddress, cause: str, *, code: str | None = None) -> None:
        super().__init__(f"node {node_id!r} ({address.describe()}): {cause}")
        self.node_id = node_id
        self.address = address
        self.cause = cause
        if code is not None:
            self.code = code


class NodeUnreachable(NodeError):
    """No SSH session: refused, timed out, reset, or login refused."""


class HostKeyMismatch(NodeError):
    """The node's host key is not the one known_hosts trusts for it."""

    code = "host_key_changed"


class CommandTimedOut(NodeError):
    """A command ran longer than the command timeout."""

    code = "timeout"


class NodeSession:
    """An open SSH connection to one node, for one action's commands."""

    def __init__(self, node_id: str, address: NodeAddress, conn: asyncssh.SSHClientConnection, timeout_s: float) -> None:
        self.node_id = node_id
        self.address = address
        self._conn = conn
        self._timeout_s = timeout_s

    async def run(self, command: str, *, input: str | None = None, timeout_s: float | None = None) -> CommandResult:
        """(exit_status, stdout, stderr) of one command; a non-zero status is a result, not an error.
        `input` is its stdin (never logged, never recorded); `timeout_s` replaces the command timeout."""
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        # asyncssh closes stdin after non-empty input only; empty input must still be an end of file.
        stdin = {"input": input} if input else {"stdin": asyncssh.DEVNULL} if input is not None else {}
        try:
            result = await self._conn.run(command, check=False, timeout=timeout_s, encoding="utf-8", errors="replace", **stdin)
        except asyncssh.TimeoutError:
            raise CommandTimedOut(self.node_id, self.address, f"command timed out after {timeout_s:g}s") from None
        except (asyncssh.Error, OSError) as exc:
            raise NodeUnreachable(self.node_id, self.address, f"connection lost: {_cause(exc)}") from None
        # None when the remote process died of a signal; any non-zero status means "did not work".
        status = result.exit_status if result.exit_status is not None else 255
        return CommandResult(status, str(result.stdout or ""), str(result.stderr or ""))

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o600, timeout_s: float | None = None) -> CommandResult:
        """Write `data` to `path` on the node (a shell word: quote it, or start it with "$HOME"/),
        readable by the login user only unless `mode` says otherwise; written beside and renamed,
        so a reader never sees half a file. Needs only sh, cat, chmod and mv on the node."""
        command = f'umask 077 && cat > {path}.part && chmod {mode:o} {path}.part && mv -f {path}.part {path}'
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        try:
            result = await self._conn.run(command, check=False, timeout=timeout_s, input=data, encoding=None)
        except asyncssh.TimeoutError:
            raise CommandTimedOut(self.node_id, self.address, f"writing {path} timed out after {timeout_s:g}s") from None
        except (asyncssh.Error, OSError) as exc:
            raise NodeUnreachable(self.node_id, self.address, f"connection lost: {_cause(exc)}") from None
        status = result.exit_status if result.exit_status is not None else 255
        return CommandResult(status, bytes(result.stdout or b"").decode(errors="replace"), bytes(result.stderr or b"").decode(errors="replace"))


class SshExecutor:
    """Opens verified SSH sessions to inventory nodes."""

    def __init__(
        self,
        *,
        inventory: Path,
        known_hosts: Path,
        client_key: Path,
        connect_timeout_s: float,
        command_timeout_s: float,
    ) -> None:
        self._inventory = inventory
        self._known_hosts = known_hosts
        self._client_key = client_key
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        # asyncssh logs every remote command line at INFO; the audit trail is the ledger, not the log.
        logging.getLogger("asyncssh").setLevel(logging.WARNING)

    @asynccontextmanager
    async def session(self, node_id: str) -> AsyncIterator[NodeSession]:
        """A session to `node_id`; raises InventoryError for an unknown node, NodeError otherwise."""
        address = address_of(self._inventory, node_id)
        async with contextlib.AsyncExitStack() as stack:
            tunnel = None
            if address.jump is not None:
                hop = address.jump
                tunnel = await self._connect(node_id, address, hop.host, hop.port, hop.user or address.user, where="jump host: ")
                stack.push_async_callback(_close, tunnel, node_id)
            conn = await self._connect(node_id, address, address.host, address.port, address.user, tunnel=tunnel)
            stack.push_async_callback(_close, conn, node_id)
            yield NodeSession(node_id, address, conn, self._command_timeout_s)

    async def run(self, node_id: str, command: str) -> CommandResult:
        """One command on its own connection (an action's commands share one through `session`)."""
        async with self.session(node_id) as session:
            return await session.run(command)

    async def check(self, node_id: str) -> None:
        """Log in and out again, running nothing; raises what `session` raises."""
        async with self.session(node_id):
            pass

    async def _connect(
        self,
        node_id: str,
        address: NodeAddress,
        host: str,
        port: int,
        user: str,
        *,
        tunnel: asyncssh.SSHClientConnection | None = None,
        where: str = "",
    ) -> asyncssh.SSHClientConnection:
        """One verified login to `host` (the node, or its jump host: `where` says which in errors)."""
        try:
            # connect_timeout covers TCP, handshake and login; the outer guard is for a peer
            # that stalls where asyncssh's own timer does not reach.
            async with asyncio.timeout(self._connect_timeout_s + 1):
                return await asyncssh.connect(
                    host,
                    port,
                    tunnel=tunnel,
                    username=user,
                    known_hosts=str(self._known_hosts),
                    client_keys=[str(address.key or self._client_key)],
                    passphrase=None,
                    agent_path=None,
                    config=[],
                    password=None,
                    preferred_auth="publickey",
                    connect_timeout=self._connect_timeout_s,
                    login_timeout=self._connect_timeout_s,
                    keepalive_interval=15,
                )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostKeyMismatch(
                node_id, address, f"{where}host key not trusted by {self._known_hosts} ({_cause(exc)})"
            ) from None
        except asyncssh.PermissionDenied:
            raise NodeUnreachable(
                node_id, address, f"{where}login refused: the client key is not authorized", code="auth_refused"
            ) from None
        except asyncssh.ChannelOpenError as exc:  # only a tunnel opens a channel while connecting
            raise NodeUnreachable(
                node_id, address, f"the jump host would not open a connection to {host}:{port} ({_cause(exc)})"
            ) from None
        except ConnectionRefusedError:
            raise NodeUnreachable(node_id, address, f"{where}connection refused", code="refused") from None
        except TimeoutError:
            raise NodeUnreachable(
                node_id, address, f"{where}connect timed out after {self._connect_timeout_s:g}s", code="timeout"
            ) from None
        except (asyncssh.Error, OSError, ValueError) as exc:
            # ValueError/KeyImportError: an unreadable known_hosts or key file.
            raise NodeUnreachable(node_id, address, f"{where}{_cause(exc)}") from None


async def _close(conn: asyncssh.SSHClientConnection, node_id: str) -> None:
    conn.close()
    try:
        await asyncio.wait_for(conn.wait_closed(), 5)
    except (TimeoutError, asyncssh.Error, OSError):
        log.debug("closing the connection to %s did not finish cleanly", node_id)


def _cause(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(reason).split())[:300]
