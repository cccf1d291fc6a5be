"""The accept queue of the node's own peer daemon: runbook 002's early sign of a blocked event loop.

A daemon whose event loop is stuck never calls accept(): the kernel still completes every TCP
handshake (so the port "accepts"), and the connections wait in the listening socket's queue ("ss
-ltn": Recv-Q 26-33 on the runbook's blocked daemons) until it is full, when new ones are dropped
and the host looks down from outside. A healthy daemon's queue is empty at nearly every instant.

The queue is read as `ss` reads it: the kernel's socket diagnostics over netlink (sock_diag),
asking for listening TCP sockets only, so a node with many thousands of connections costs the
same as one with none (no /proc/net/tcp to parse). No privilege is needed; it sees the sockets of
the sampler's network namespace (the host's, for a sampler on the host network).
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
from dataclasses import dataclass
from datetime import datetime
from ipaddress import ip_address
from urllib.parse import urlsplit

from gpumedic_events import ListenBacklogReported

log = logging.getLogger(__name__)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBxI")  # inet_diag_req_v2 up to its socket id: family, protocol, extensions, states
_SOCKET_ID = 48  # inet_diag_sockid: ports, addresses, interface, cookie
_PORT = struct.Struct("!H")  # idiag_sport, at the start of the socket id, in network order
_QUEUES = struct.Struct("=II")  # idiag_rqueue, idiag_wqueue after family..retrans (4), the id and expires (4)
_QUEUES_AT = 4 + _SOCKET_ID + 4
REPORT_FROM = 2
"""Connections waiting before the node says so: one can wait for an instant on any busy daemon."""


@dataclass(frozen=True)
class Backlog:
    waiting: int
    limit: int


class ListenQueue:
    """Reads how many connections wait to be accepted on one local port, and says so on the bus
    (`ListenBacklogReported`) while at least REPORT_FROM wait, and once when the queue drains."""

    def __init__(self, port: int) -> None:
        if not 1 <= port <= 65535:
            raise ValueError(f"listen port {port} is not a TCP port")
        self.port = port
        self._reported = False
        self._failed = False

    @classmethod
    def of_status_url(cls, url: str | None) -> ListenQueue | None:
        """The status endpoint's port when the URL names this node (loopback); else None, since
        another machine's queue cannot be read from here."""
        if not url:
            return None
        parts = urlsplit(url)
        host = parts.hostname or ""
        try:
            local = host == "localhost" or ip_address(host).is_loopback
        except ValueError:
            local = False
        if not local:
            return None
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None
        return cls(port)

    def read(self) -> Backlog | None:
        """The queue of the sockets listening on the port (IPv4 and IPv6 together); None when
        nothing listens there (the daemon is down: the status probe says so) or it cannot be read."""
        try:
            found = [b for family in (socket.AF_INET, socket.AF_INET6) for b in _listening(family) if b[0] == self.port]
        except OSError as exc:
            if not self._failed:
                log.warning("the accept queue of port %d cannot be read (%s); not read again until it can", self.port, exc)
                self._failed = True
            return None
        self._failed = False
        if not found:
            return None
        return Backlog(waiting=sum(b[1] for b in found), limit=sum(b[2] for b in found))

    def report(self, node_id: str, backlog: Backlog | None, at: datetime) -> ListenBacklogReported | None:
        """What to send this sample: the queue while REPORT_FROM or more wait, then one all-clear."""
        waiting = backlog.waiting if backlog is not None else 0
        if waiting >= REPORT_FROM:
            self._reported = True
        elif self._reported:
            self._reported = False
            waiting = 0
        else:
            return None
        return ListenBacklogReported(source="node-sampler", occurred_at=at, node_id=node_id, port=self.port,
                                     waiting=waiting, limit=backlog.limit if backlog is not None else 0)


def _listening(family: int) -> list[tuple[int, int, int]]:
    """(port, waiting, limit) of every listening TCP socket of one address family."""
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 1 << TCP_LISTEN) + bytes(_SOCKET_ID)
    message = _HEADER.pack(_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + request
    found: list[tuple[int, int, int]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2.0)
        nl.sendto(message, (0, 0))
        while True:
            data = nl.recv(65536)
            at = 0
            while at + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, at)
                if length < _HEADER.size:
                    return found
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, at + _HEADER.size)
                    if code:
                        raise OSError(-code, f"sock_diag: {errno.errorcode.get(-code, -code)}")
                    return found
                body = at + _HEADER.size
                (port,) = _PORT.unpack_from(data, body + 4)
                waiting, limit = _QUEUES.unpack_from(data, body + _QUEUES_AT)
                found.append((port, waiting, limit))
                at += (length + 3) & ~3
