"""The tests' PostgreSQL starts wherever the repository is cloned: as root, from a checkout in a private folder
(`mktemp -d`, /root: 0700), whose virtualenv the server's own user cannot enter."""

import os
import shutil
import subprocess
import tempfile

import pytest

from ddb_athena_bench import postgres_server as module
from ddb_athena_bench.postgres_server import SYSTEM_USER, postgres_server

pytestmark = pytest.mark.subprocess


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user, the server runs as the checkout's owner, who can reach it")
def test_a_checkout_in_a_private_folder_still_starts_the_server(tmp_path, monkeypatch):
    private = tmp_path / "clone"  # pytest's own temporary folders are 0700 too
    private.mkdir(mode=0o700)
    packaged = private / "site-packages" / "pgserver" / "pginstall"
    shutil.copytree(module.PACKAGED, packaged, symlinks=True)
    shutil.copytree(module.PACKAGED.parent.parent / "pgserver.libs", packaged.parent.parent / "pgserver.libs", symlinks=True)
    # The situation itself: the server's user cannot run the checkout's binaries.
    denied = subprocess.run(["runuser", "-u", SYSTEM_USER, "--", str(packaged / "bin" / "initdb"), "--version"], capture_output=True)
    assert denied.returncode != 0 and b"Permission denied" in denied.stderr, denied
    monkeypatch.setattr(module, "PACKAGED", packaged)
    reachable = tempfile.mkdtemp(prefix="ddb_athena_test_tmp_")  # a fresh temporary directory: no copy made before
    os.chmod(reachable, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", reachable)
    try:
        with postgres_server() as server, server.connect_as_master() as connection, connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            assert "PostgreSQL" in cursor.fetchone()[0]
        connection.close()
    finally:
        shutil.rmtree(reachable, ignore_errors=True)
