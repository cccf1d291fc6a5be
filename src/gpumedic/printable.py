"""Text from nodes and people is data on every output: what `gpumedic` prints reaches the terminal
with no control character it could obey (a clear screen, a window title, text turned right to
left). Kept apart from `output` so that every command can wrap its streams without importing the
tables' libraries.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from gpumedic_events.redact import BIDI, CONTROLS

_SPOKEN = re.compile(f"(?P<sgr>\x1b\\[[0-9;]*m)|(?P<control>[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI}])")
"""What a command's output may not carry raw: every control but a line's end and a tab. `sgr`: a
colour, let through only where colour is on, and only of `table`'s palette (`_PALETTE`)."""
_PALETTE = re.compile("\x1b\\[(?:0|1|22|31|32|33|39)?m")
"""The SGR sequences `table` paints with (bold, red, amber, green, their resets): a node's text on a
terminal could use these as well, but no other (no hidden text, no black on black)."""


def _escaped(char: str) -> str:
    """A control as text: `\\x1b` for C0, `\\u009b` for DEL, C1 and bidi (valid inside a JSON string too)."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`text` with every control character (C0, DEL, C1, bidi) written as an escape (`\\x1b`,
    `\\u202e`), so that text from a node or another service is shown, never obeyed by the terminal."""
    return CONTROLS.sub(lambda m: _escaped(m.group()), str(text))


class PrintableStream(io.TextIOBase):
    """A command's stdout or stderr through which nothing reaches the terminal as a control: every
    line a command prints, whatever path it took (a detail view, an error, a summary), has its
    controls escaped as `printable` does, lines and tabs kept, and `table`'s colours kept only
    where `colour` is on. Node data is data on every output."""

    def __init__(self, stream: Any, *, colour: bool) -> None:
        self._stream = stream
        self._colour = colour

    def write(self, text: str) -> int:
        self._stream.write(_SPOKEN.sub(self._spoken, text))
        return len(text)

    def _spoken(self, match: re.Match[str]) -> str:
        if match["sgr"] is not None:
            return match["sgr"] if self._colour and _PALETTE.fullmatch(match["sgr"]) else printable(match["sgr"])
        return _escaped(match["control"])

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", "utf-8")


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """stdout and stderr as `PrintableStream`s while a command runs (`gpumedic` wraps every one)."""
    saved = sys.stdout, sys.stderr
    sys.stdout = PrintableStream(saved[0], colour=colour_on())
    sys.stderr = PrintableStream(saved[1], colour=False)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def colour_on() -> bool:
    """Colour only for a person at a terminal who has not said NO_COLOR (any non-empty value)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


