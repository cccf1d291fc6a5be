"""The commands that read the store say which store and what is wrong with it, never a traceback
or a password."""

from __future__ import annotations

import pytest

from gpumedic.cli import main
from gpumedic_store import upgrade


@pytest.mark.parametrize("command", [["drained"], ["actions"], ["incidents"]])
def test_a_store_never_migrated_is_named_with_the_fix(tmp_path, capsys, command):
    url = f"sqlite+aiosqlite:///{tmp_path}/empty.db"
    (tmp_path / "empty.db").touch()  # a file, but no tables
    assert main([*command, "--store", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpumedic: the store at {url} cannot be read: no such table") and "gpumedic migrate" in err


def test_a_store_that_is_down_is_named_without_its_password(capsys):
    assert main(["drained", "--store", "postgresql+asyncpg://gpumedic:hunter2@127.0.0.1:1/gpumedic"]) == 2
    err = capsys.readouterr().err
    assert "127.0.0.1:1" in err and "unavailable" in err and "hunter2" not in err


def test_drained_lists_nothing_on_a_fresh_store(tmp_path, capsys):
    url = f"sqlite+aiosqlite:///{tmp_path}/fresh.db"
    upgrade(url)
    assert main(["drained", "--store", url]) == 0
    assert capsys.readouterr().out.strip() == "no node is drained"


def test_a_plain_sqlite_url_is_read_with_the_async_driver(tmp_path, capsys):
    """`--store sqlite:///x.db`, as SQLAlchemy's docs write it, works as sqlite+aiosqlite does."""
    assert main(["migrate", "--store", f"sqlite:///{tmp_path}/plain.db"]) == 0
    assert main(["incidents", "--store", f"sqlite:///{tmp_path}/plain.db"]) == 0
    assert capsys.readouterr().out.strip().endswith("no incidents recorded")


def test_a_database_gpumedic_cannot_use_is_refused_by_name(capsys):
    assert main(["incidents", "--store", "mysql://gpumedic:hunter2@db/gpumedic"]) == 2
    err = capsys.readouterr().err
    assert "mysql is not supported; use sqlite:///FILE or postgresql://" in err and "hunter2" not in err
