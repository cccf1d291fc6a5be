"""A container's last log lines, from the Docker engine's log stream as it arrives (`logs?tail=N`):
demultiplexed, assembled into lines per stream, cleaned and bounded."""

from __future__ import annotations

import collections

from node_sampler.readings import clean_text

MAX_LINE = 1024
"""A log line is cut at this many characters (the event's LogLine limit)."""
MAX_LINE_BYTES = 8 * MAX_LINE
"""Bytes of one raw log line kept before cleaning; enough for MAX_LINE characters of UTF-8."""


class LogTail:
    """The last `keep` lines of a container's log, cleaned, from raw bytes as they arrive.

    Without a TTY the engine multiplexes stdout and stderr: each frame is an 8-byte header
    (stream 0/1/2, three zero bytes, big-endian uint32 size) and its payload. Lines are
    assembled per stream, so a frame that ends mid-line does not merge with the other stream.
    A header that cannot be one means the stream is raw after all; the rest is read as text.
    """

    def __init__(self, keep: int, *, multiplexed: bool) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=max(0, keep))
        self._multiplexed = multiplexed
        self._header = b""
        self._frame_left = 0
        self._stream = 1
        self._partial: dict[int, bytearray] = {}

    def feed(self, data: bytes) -> None:
        if not self._multiplexed:
            self._text(0, data)
            return
        i = 0
        while i < len(data):
            if self._frame_left == 0:
                need = 8 - len(self._header)
                self._header += data[i : i + need]
                i += need
                if len(self._header) < 8:
                    return
                header, self._header = self._header, b""
                if header[0] > 2 or header[1:4] != b"\0\0\0":
                    self._multiplexed = False
                    self._text(0, header + data[i:])
                    return
                self._stream = header[0]
                self._frame_left = int.from_bytes(header[4:8], "big")
                continue
            piece = data[i : i + self._frame_left]
            i += len(piece)
            self._frame_left -= len(piece)
            self._text(self._stream, piece)

    def take(self) -> tuple[str, ...]:
        """The whole lines assembled since the last take (a followed log: a line still arriving stays)."""
        lines = tuple(self._lines)
        self._lines.clear()
        return lines

    def lines(self) -> tuple[str, ...]:
        """The kept lines, oldest first, including a last line without a newline."""
        for stream in sorted(self._partial):
            if self._partial[stream]:
                self._emit(bytes(self._partial[stream]))
        self._partial.clear()
        return tuple(self._lines)

    def _text(self, stream: int, data: bytes) -> None:
        buffer = self._partial.setdefault(stream, bytearray())
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            buffer += data[start:end][: max(0, MAX_LINE_BYTES - len(buffer))]
            self._emit(bytes(buffer))
            buffer.clear()
            start = end + 1
        buffer += data[start:][: max(0, MAX_LINE_BYTES - len(buffer))]

    def _emit(self, raw: bytes) -> None:
        line = clean_text(raw.decode("utf-8", errors="replace"), MAX_LINE).rstrip()
        if line:
            self._lines.append(line)
