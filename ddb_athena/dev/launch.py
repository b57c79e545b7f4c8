"""Launches a job's partition through a running Dagster webserver, so the run belongs to the instance the UI
shows (its run queue, its storage) instead of a second process initializing that storage at the same time."""

import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

PARTITION_TAG = "dagster/partition"
_FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


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
    host: str,
    port: int,
    job_name: str,
    partition: str,
    ready_timeout_seconds: float,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Submits the partition's run once the webserver answers and knows the job; returns its run id."""
    date.fromisoformat(partition)  # a daily partition key; a typo fails here, not in the run
    return launch_run(host, port, job_name, {PARTITION_TAG: partition}, f" for partition {partition}", ready_timeout_seconds, log, sleep)


def launch_run(
    host: str,
    port: int,
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
    while True:
        try:
            client = DagsterGraphQLClient(host, port_number=port)
            run_id = client.submit_job_execution(job_name, tags=tags)
            log(f"launched {job_name}{what}: run {run_id}, http://{host}:{port}/runs/{run_id}")
            return run_id
        except DagsterGraphQLClientError as error:
            waiting_for = _waiting_for(error)
            if waiting_for is None:
                raise
            if waiting_for != last_waiting_for:
                log(f"waiting for Dagster at {host}:{port}: for {waiting_for}")
                last_waiting_for = waiting_for
            if time.monotonic() > deadline:
                raise TimeoutError(f"Dagster at {host}:{port} did not serve job {job_name} within {ready_timeout_seconds:.0f} s") from error
            sleep(2)


def follow_run(
    host: str, port: int, run_id: str, log: Callable[[str], None], poll_seconds: float = 5, sleep: Callable[[float], None] = time.sleep
) -> DagsterRunStatus:
    """Logs the run's status as it changes until it finishes; returns the final status."""
    client, last = DagsterGraphQLClient(host, port_number=port), None
    while True:
        status = client.get_run_status(run_id)
        if status != last:
            log(f"run {run_id}: {status.value}")
            last = status
        if status in _FINISHED:
            return status
        sleep(poll_seconds)
