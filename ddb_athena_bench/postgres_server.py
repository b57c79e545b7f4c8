"""A real PostgreSQL server for the tests and benchmarks of a deployment's instance (deploy/dagster.yaml), reached as
the instance reaches RDS: through an RDS-like front (`rds_front.py`: TLS verified against a CA of its own, IAM
database authentication for the instance's role). The server itself, from the `pgserver` package's binaries, listens
on its Unix socket only; its master user logs in with a password, the instance's role is created and handed the
database by the same code a deployment's setup task runs (`ensure_database_role`)."""

import importlib.metadata
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

from ddb_athena.lib.database_role import RDS_IAM, ensure_database_role
from ddb_athena_bench.rds_front import RdsFront, make_authority

PACKAGED = Path(pgserver.__file__).parent / "pginstall"
# PostgreSQL refuses to run as root: the tests' root runs it as pgserver's own system user.
SYSTEM_USER = "pgserver"


# The credentials the tests and benchmarks give their processes: the front accepts tokens they sign.
TEST_CREDENTIALS = {"testing": "testing", "bench": "bench"}


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str  # the instance's role: IAM tokens only
    master_user: str
    password: str  # the master user's
    database: str
    ca_file: Path
    front: RdsFront

    def environment(self) -> dict[str, str]:
        """The variables deploy/dagster.yaml reads (the platform stack sets them; no password: the role's tokens are
        signed with the task's credentials), and libpq's CA file (the image's RDS CA bundle)."""
        return {
            "DAGSTER_POSTGRES_HOST": self.host,
            "DAGSTER_POSTGRES_PORT": str(self.port),
            "DAGSTER_POSTGRES_USER": self.user,
            "DAGSTER_POSTGRES_DB": self.database,
            "PGSSLROOTCERT": str(self.ca_file),
        }

    def master_environment(self) -> dict[str, str]:
        """What the platform stack's database setup task adds (ECS injects the password from the managed secret)."""
        return {**self.environment(), "DAGSTER_POSTGRES_MASTER_USER": self.master_user, "DAGSTER_POSTGRES_MASTER_PASSWORD": self.password}

    def connect(self, user: str, password: str, ca_file: Path | None = None):
        """A connection as a client of the deployment makes one: TLS verified against `ca_file` (the front's CA)."""
        import psycopg2

        return psycopg2.connect(
            host=self.host, port=self.port, dbname=self.database, user=user, password=password, sslmode="verify-full", sslrootcert=str(ca_file or self.ca_file)
        )

    def connect_as_master(self):
        return self.connect(self.master_user, self.password)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SYSTEM_USER, "--", *command] if os.geteuid() == 0 else command


def server_binaries() -> Path:
    """The `bin` folder of PostgreSQL's binaries, where the server's user can run them. As root that user is not the
    checkout's owner, and a checkout under a private folder (`mktemp -d`, /root: 0700) keeps it out of the virtualenv:
    root then runs a copy in the temporary directory, made once per pgserver version (renamed into place, so workers
    that race make it once), owned by root and readable by all. The binaries find their libraries by a path relative
    to their own (RPATH `$ORIGIN/../../../pgserver.libs`): the copy keeps the wheel's layout."""
    if os.geteuid() != 0:
        return PACKAGED / "bin"
    copy = Path(tempfile.gettempdir()) / f"ddb_athena_pgserver-{importlib.metadata.version('pgserver')}"
    if not copy.exists():
        staging = Path(tempfile.mkdtemp(prefix=f"{copy.name}-", dir=copy.parent))
        shutil.copytree(PACKAGED, staging / "pgserver" / "pginstall", symlinks=True)
        shutil.copytree(PACKAGED.parent.parent / "pgserver.libs", staging / "pgserver.libs", symlinks=True)
        for folder in [staging, *(path for path in staging.rglob("*") if path.is_dir())]:
            folder.chmod(0o755)
        try:
            staging.rename(copy)
        except OSError:  # another worker's copy won the rename
            shutil.rmtree(staging, ignore_errors=True)
    return copy / "pgserver" / "pginstall" / "bin"


@contextmanager
def postgres_server(
    user: str = "dagster_app", master_user: str = "dagster", password: str = "a-test-password-42", database: str = "dagster", credentials: dict | None = None
) -> Iterator[Postgres]:
    """A fresh server behind its front, `master_user` (password authentication) owning `database` and `user` the
    instance's role (IAM tokens signed by `credentials`, default TEST_CREDENTIALS); stopped and removed after. Its
    directory is directly under the temporary directory: the server's user cannot enter a pytest one (0700, root's)."""
    directory = Path(tempfile.mkdtemp(prefix="ddb_athena_postgres_"))
    pg = server_binaries()
    data = directory / "data"
    password_file = directory / "password"
    password_file.write_text(password)
    if os.geteuid() == 0:
        ensure_user_exists(SYSTEM_USER)
        subprocess.run(["chown", "-R", SYSTEM_USER, str(directory)], check=True)
    subprocess.run(
        _as_server_user([str(pg / "initdb"), "-D", str(data), "-U", master_user, f"--pwfile={password_file}", "--auth=scram-sha-256", "-E", "UTF8"]),
        check=True,
        capture_output=True,
    )
    # The front has checked the role's token before it opens the session on the socket (RDS's pg_hba: rds_iam).
    hba = data / "pg_hba.conf"
    subprocess.run(_as_server_user(["sh", "-c", f'printf "local all {user} trust\\n%s\\n" "$(cat {hba})" > {hba}.new && mv {hba}.new {hba}']), check=True)
    port = _free_port()  # names the socket
    options = f"-h '' -p {port} -k {directory}"
    subprocess.run(
        _as_server_user([str(pg / "pg_ctl"), "-D", str(data), "-w", "-l", str(directory / "log"), "-o", options, "start"]), check=True, capture_output=True
    )
    front = None
    try:
        master = {**os.environ, "PGPASSWORD": password}
        subprocess.run([str(pg / "createdb"), "-h", str(directory), "-p", str(port), "-U", master_user, database], check=True, capture_output=True, env=master)
        # RDS's own role for IAM authentication, which only RDS has.
        subprocess.run(
            [str(pg / "psql"), "-h", str(directory), "-p", str(port), "-U", master_user, "-d", database, "-c", f"CREATE ROLE {RDS_IAM} NOLOGIN"],
            check=True,
            capture_output=True,
            env=master,
        )
        authority = make_authority(directory)
        front = RdsFront(directory / f".s.PGSQL.{port}", authority, {user}, credentials or TEST_CREDENTIALS)
        server = Postgres("127.0.0.1", front.port, user, master_user, password, database, authority.ca_file, front)
        with server.connect_as_master() as connection:
            ensure_database_role(connection, user)
        connection.close()
        yield server
    finally:
        if front:
            front.close()
        subprocess.run(_as_server_user([str(pg / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)
