"""Launches a job's partition through a running Dagster webserver, so the run belongs to the instance the UI
shows (its run queue, its storage) instead of a second process initializing that storage at the same time. The
webserver is `make dev`'s (127.0.0.1, $DAGSTER_PORT) or a deployment's, at its URL."""

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlsplit

from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

PARTITION_TAG = "dagster/partition"
# Who launched a run from the command line: Dagster OSS has no login, so the UI's own launches carry no one; the CLI's
# name the caller's AWS identity (the credentials the operator reached the deployment with), else the local user.
LAUNCHED_BY_TAG = "ddb_athena/launched_by"
_FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
URL_VARIABLE = "DDB_ATHENA_DAGSTER_URL"
DEFAULT_DAGSTER_PORT = "3000"
# One GraphQL request: a host that drops packets fails within this, not the client's five minutes.
REQUEST_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class Webserver:
    """A Dagster webserver, by its URL (http or https, a host, a port, a path prefix)."""

    url: str

    @classmethod
    def at(cls, url: str | None, env: Mapping[str, str] = os.environ) -> "Webserver":
        """`url`, else $DDB_ATHENA_DAGSTER_URL, else `make dev`'s: http://127.0.0.1:$DAGSTER_PORT."""
        url = url or env.get(URL_VARIABLE) or f"http://127.0.0.1:{env.get('DAGSTER_PORT') or DEFAULT_DAGSTER_PORT}"
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or parts.query or parts.fragment:
            raise ValueError(f"{url!r} is not a Dagster webserver's URL: expected http(s)://host[:port][/path prefix]")
        return cls(url.rstrip("/"))

    def client(self) -> DagsterGraphQLClient:
        parts = urlsplit(self.url)
        # The client puts `:port` after the host name it is given: the port and path prefix go in with it.
        return DagsterGraphQLClient(parts.netloc + parts.path, use_https=parts.scheme == "https", timeout=REQUEST_TIMEOUT_SECONDS)

    def run_url(self, run_id: str) -> str:
        return f"{self.url}/runs/{run_id}"


def yesterday_utc(now: datetime | None = None) -> str:
    """The last complete daily partition (computed here: BSD `date` has no `-d yesterday`)."""
    return ((now or datetime.now(UTC)) - timedelta(days=1)).date().isoformat()


def _waiting_for(error: DagsterGraphQLClientError) -> str | None:
    """What the webserver is not ready with yet, or None when the error is not about readiness."""
    cause = error.__cause__ or error.__context__
    while cause is not None:
        if isinstance(cause, OSError):  # connection refused or reset: not listening yet
            return "the webserver to answer"
        cause = cause.__cause__ or cause.__context__
    kind = str(error.args[0]) if error.args else ""
    if kind.endswith("NotFoundError") or "RepositoryLocation" in kind:
        return f"its code location to load ({kind})"
    return None


def launch_partition_run(
    webserver: Webserver,
    job_name: str,
    partition: str,
    ready_timeout_seconds: float,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Submits the partition's run once the webserver answers and knows the job; returns its run id."""
    date.fromisoformat(partition)  # a daily partition key; a typo fails here, not in the run
    return launch_run(webserver, job_name, {PARTITION_TAG: partition}, f" for partition {partition}", ready_timeout_seconds, log, sleep)


def launched_by() -> str:
    """The launching principal: the AWS identity of this process's credentials, else user@host."""
    import getpass
    import socket

    from botocore.exceptions import BotoCoreError, ClientError

    from ddb_athena.lib.settings import Settings

    try:
        return Settings.from_env().client("sts").get_caller_identity()["Arn"]
    except (BotoCoreError, ClientError):
        return f"{getpass.getuser()}@{socket.gethostname()}"


def launch_run(
    webserver: Webserver,
    job_name: str,
    tags: dict[str, str],
    what: str,
    ready_timeout_seconds: float,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Submits a run of the job (into the instance's run queue) once the webserver answers and knows the job."""
    deadline = time.monotonic() + ready_timeout_seconds
    last_waiting_for = None
    tags = {**tags, LAUNCHED_BY_TAG: launched_by()}
    while True:
        try:
            run_id = webserver.client().submit_job_execution(job_name, tags=tags)
            log(f"launched {job_name}{what}: run {run_id}, {webserver.run_url(run_id)}")
            return run_id
        except DagsterGraphQLClientError as error:
            waiting_for = _waiting_for(error)
            if waiting_for is None:
                raise
            if waiting_for != last_waiting_for:
                log(f"waiting for Dagster at {webserver.url}: for {waiting_for}")
                last_waiting_for = waiting_for
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Dagster at {webserver.url} did not serve job {job_name} within {ready_timeout_seconds:g} s (waiting for {waiting_for}; "
                    f"--url or ${URL_VARIABLE} names another webserver, --ready-timeout waits longer)"
                ) from None
            sleep(2)


def follow_run(
    webserver: Webserver, run_id: str, log: Callable[[str], None], poll_seconds: float = 5, sleep: Callable[[float], None] = time.sleep
) -> DagsterRunStatus:
    """Logs the run's status as it changes until it finishes; returns the final status."""
    client, last = webserver.client(), None
    while True:
        status = client.get_run_status(run_id)
        if status != last:
            log(f"run {run_id}: {status.value}")
            last = status
        if status in _FINISHED:
            return status
        sleep(poll_seconds)
