"""A real PostgreSQL server for the tests and benchmarks of a deployment's instance (deploy/dagster.yaml): the binaries
of the `pgserver` package, listening on loopback TCP with a password, as RDS does (pgserver itself only opens a
socket)."""

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pgserver
from pgserver.utils import ensure_user_exists

BIN = Path(pgserver.__file__).parent / "pginstall" / "bin"
# PostgreSQL refuses to run as root: the tests' root runs it as pgserver's own system user.
SYSTEM_USER = "pgserver"


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    password: str
    database: str

    def environment(self) -> dict[str, str]:
        """The variables deploy/dagster.yaml reads (ECS sets them; the password from the database's secret)."""
        return {
            "DAGSTER_POSTGRES_HOST": self.host,
            "DAGSTER_POSTGRES_PORT": str(self.port),
            "DAGSTER_POSTGRES_USER": self.user,
            "DAGSTER_POSTGRES_PASSWORD": self.password,
            "DAGSTER_POSTGRES_DB": self.database,
        }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SYSTEM_USER, "--", *command] if os.geteuid() == 0 else command


@contextmanager
def postgres_server(user: str = "dagster", password: str = "a-test-password-42", database: str = "dagster") -> Iterator[Postgres]:
    """A fresh server, with `user` (password authentication over TCP) owning `database`; stopped and removed after.
    Its directory is directly under the temporary directory: the server's user cannot enter a pytest one (0700, root's)."""
    directory = Path(tempfile.mkdtemp(prefix="ddb_athena_postgres_"))
    data = directory / "data"
    password_file = directory / "password"
    password_file.write_text(password)
    if os.geteuid() == 0:
        ensure_user_exists(SYSTEM_USER)
        subprocess.run(["chown", "-R", SYSTEM_USER, str(directory)], check=True)
    subprocess.run(
        _as_server_user([str(BIN / "initdb"), "-D", str(data), "-U", user, f"--pwfile={password_file}", "--auth=scram-sha-256", "-E", "UTF8"]),
        check=True,
        capture_output=True,
    )
    port = _free_port()
    options = f"-h 127.0.0.1 -p {port} -k {directory}"
    subprocess.run(
        _as_server_user([str(BIN / "pg_ctl"), "-D", str(data), "-w", "-l", str(directory / "log"), "-o", options, "start"]), check=True, capture_output=True
    )
    try:
        subprocess.run(
            [str(BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, database],
            check=True,
            capture_output=True,
            env={**os.environ, "PGPASSWORD": password},
        )
        yield Postgres("127.0.0.1", port, user, password, database)
    finally:
        subprocess.run(_as_server_user([str(BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)
