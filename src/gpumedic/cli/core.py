"""The CLI's frame: the `gpumedic` group, how a command is registered, the options commands share,
where the store is, and `main`."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import click


from gpumedic.printable import printable_output

DEFAULT_VAR = Path("var")
EXTENSIONS: dict[str, Callable[[SimpleNamespace], int]] = {}
"""Handlers that installed packages add to the built-in commands (the simulated fleet's `up --demo`)."""
COMMANDS_GROUP = "gpumedic.commands"
"""The entry-point group through which an installed package adds commands (gpumedic-sim: demo, sim,
chaos, fleet): each entry point names a function that calls `command` for each."""

_DESCRIPTION = """\
gpumedic finds and fixes what goes wrong on rented GPU fleets: zombie jobs, GPUs held by
leftover processes, leaderless clusters, stuck workers. It samples every node, detects,
decides, acts over SSH through one safety gate, verifies, and records each incident with
its trace.

\b
Start here:
  gpumedic demo              the whole stack on one machine with a simulated fleet and
                             one injected zombie job, shown from detection to fix
  gpumedic up                the embedded stack (bus, store, six services) until Ctrl-C
  gpumedic incidents         what happened; `gpumedic incidents ID` for one incident's
                             timeline and trace
"""


def run_until_done(coro: Coroutine) -> int:
    """Run until done, Ctrl-C or SIGTERM; cleanup in the coroutine's `finally` always runs."""

    async def _main():
        task = asyncio.current_task()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await coro

    try:
        return asyncio.run(_main()) or 0
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    except (RuntimeError, TimeoutError, OSError) as exc:  # a service or server that would not start
        print(f"gpumedic: {exc}", file=sys.stderr)
        return 1


class NoStore(Exception):
    """A reading command found no store where it looked; the message says where and what to do."""


def store_url(args, *, reading: bool = True) -> str:
    """Where every command finds the store: --store, else GPUMEDIC_STORE_URL, else the embedded
    stack's under --var. A command that reads never creates one: a SQLite file that is not there
    is NoStore (only `migrate` makes one)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from gpumedic_store.settings import async_url, mask_url

    var = getattr(args, "var", None) or DEFAULT_VAR
    given = getattr(args, "store", None)
    named = os.environ.get("GPUMEDIC_STORE_URL", "").strip()
    url = async_url(given or named or f"sqlite+aiosqlite:///{var / 'gpumedic.db'}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise NoStore(f"{mask_url(url)!r} is not a store URL (sqlite:///PATH or postgresql://USER@HOST/DB)") from None
    if reading:
        if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") and not Path(parsed.database).exists():
            where = ("the store --store names" if given else "the store GPUMEDIC_STORE_URL names" if named
                     else f"no stack has run under {var}/")
            raise NoStore(f"no store at {mask_url(url)} ({where}): start one with `gpumedic up --var DIR` and pass that --var, "
                          f"or name the store with --store URL or GPUMEDIC_STORE_URL")
    return url


# --- the commands' arguments (click) ------------------------------------------------------------

STORE_HELP = "store URL (default: GPUMEDIC_STORE_URL, else the embedded stack's under --var)"
VAR_HELP = "the embedded stack's directory (default ./var)"
PATH = click.Path(path_type=Path)


@click.group(help=_DESCRIPTION, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def cli() -> None:
    """The front door: one sub-command per job."""


def command(name: str, handler: Callable[[SimpleNamespace], int], help: str, *options, description: str | None = None):
    """Register `handler(args)` as `gpumedic NAME` with `options` (click decorators, top first);
    its return value is the exit status."""

    def callback(**values) -> int:
        args = SimpleNamespace(**values)
        try:
            return handler(args)
        except Exception as exc:
            code = _store_failure(exc, args)
            if code is None:
                raise
            return code

    for option in reversed(options):
        callback = option(callback)
    cli.command(name, help=description or help, short_help=help)(callback)


def json_option():
    return click.option("--json", is_flag=True, help="print JSON instead of a table (for scripts and jq)")


def store_option():
    return click.option("--store", help=STORE_HELP)


def var_option():
    return click.option("--var", type=PATH, default=DEFAULT_VAR, show_default=True, help=VAR_HELP)


def fleet_options(nodes: int = 4, gpus: int = 2, var: Path = DEFAULT_VAR, throwaway: bool = False):
    where = "where the bus, store, logs and fleet files live"
    return (
        click.option("--nodes", type=click.IntRange(min=1), default=nodes, show_default=True, help="simulated nodes"),
        click.option("--gpus", type=click.IntRange(min=1), default=gpus, show_default=True, help="GPUs per simulated node"),
        click.option("--var", type=PATH, default=var, show_default=True,
                     help=where + (": emptied at each start, so each run tells the same story" if throwaway else
                                   " (with --demo, the demo's story runs in VAR/demo, emptied at each start)")),
    )


def cluster_option():
    return click.option("--cluster", type=click.IntRange(1, 5), default=1, show_default=True,
                        help="nats-servers in one JetStream cluster on loopback, streams replicated on up to 3 (3 survives one loss)")


def replicas_option():
    return click.option("--replicas", multiple=True, metavar="SERVICE=N", callback=_replicas,
                        help="run N processes of a service (repeatable; zombie-detector, leader-health, autoscaler: one "
                        "acts, the others take over; the remediator: they share the work)")


def _replicas(_ctx, _param, value: tuple[str, ...]) -> dict[str, int]:
    if not value:
        return {}
    from gpumedic.stack import REPLICABLE

    counts = {}
    for item in value:
        service, _, count = item.partition("=")
        if service not in REPLICABLE:
            raise click.BadParameter(f"{item!r}: {service or 'a service'} does not run as replicas; these do: {', '.join(REPLICABLE)}")
        if not count.isdigit() or not 1 <= int(count) <= 16:
            raise click.BadParameter(f"{item!r}: N is 1 to 16 (16 partitions: more would have nothing to share)")
        counts[service] = int(count)
    return counts


def by_option(default: str = "operator", what: str = "who (kept in the audit)"):
    return click.option("--by", default=os.environ.get("USER", default), show_default="$USER", help=what)


def _store_failure(exc: Exception, args) -> int | None:
    """A store that is down, or was never migrated, is the usual cause of a read command's failure:
    say which store (masked) and what it said, in one line, without a traceback. None: another failure."""
    from sqlalchemy.exc import DBAPIError

    from gpumedic_store import StoreUnavailable
    from gpumedic_store.engine import unreadable
    from gpumedic_store.settings import mask_url

    if isinstance(exc, StoreUnavailable | NoStore):
        print(f"gpumedic: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, DBAPIError) and hasattr(args, "store"):
        print(f"gpumedic: the store at {mask_url(store_url(args))} cannot be read: {unreadable(exc)}", file=sys.stderr)
        return 2
    return None


@functools.cache
def _load_extensions() -> None:
    """Let installed packages add their commands, once."""
    for entry in entry_points(group=COMMANDS_GROUP):
        entry.load()()


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. Bad arguments exit 2 with one line that says what was wrong."""
    _load_extensions()
    with printable_output():
        return _run(argv)


def _run(argv: list[str] | None) -> int:
    try:
        return cli.main(args=argv, prog_name="gpumedic", standalone_mode=False) or 0
    except click.exceptions.Exit as exc:  # --help
        return exc.exit_code
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "gpumedic"
        print(f"{command}: {exc.format_message()} (see {command} --help)", file=sys.stderr)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 130
