"""report-builder's web console (see `server`): pages, live updates and the operator's operations."""

from report_builder.console.server import Console, ConsoleConfig

__all__ = ["Console", "ConsoleConfig"]
