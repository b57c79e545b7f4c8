"""The real stack's pieces the stack tests share: dagster-webserver and dagster-daemon on one instance as `make dev`
runs them, waits, the runs that write a table and when each held it, the tables read back as Athena reads them."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psutil
import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunRecord, RunsFilter

from ddb_athena.dev.local_runs import limit_writer_pools
from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lib.writer_lease import WRITER_POOLS
from ddb_athena.streamed.handover import INTERRUPTED_TAG, STOP_TIMEOUT_SECONDS, SYNC_JOB_NAME
from ddb_athena_faults.dagster_api import process_alive, stop_as_ecs_does, worker_pid
from ddb_athena_tests.books_and_orders import BOOKS_WRITER_POOL

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def dagster_stack(home: Path, port: int, env: dict, storage: dict | None = None, workspace: Path = REPO / "workspace.yaml"):
    """dagster-webserver and dagster-daemon on one instance, as `make dev` runs them (with `storage`, that block of
    dagster.yaml instead of SQLite's); every process they started (code servers, run workers, their JVMs) is stopped
    with them."""
    settings = yaml.safe_load((REPO / "dagster.yaml").read_text())
    if storage is not None:
        settings["storage"] = storage
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings))
    with DagsterInstance.from_config(str(home)) as instance:  # its storage created once, before two processes race to
        limit_writer_pools(instance, WRITER_POOLS)  # as `make dev` does
    logs = home / "stack-logs"  # not $DAGSTER_HOME/logs, which Dagster's telemetry uploader empties
    logs.mkdir()
    commands = {
        "webserver": [str(BIN / "dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)],
        "daemon": [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)],
    }
    processes = [
        subprocess.Popen(command, cwd=REPO, env=env, stdout=(logs / f"{name}.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        for name, command in commands.items()
    ]
    try:
        yield logs
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # run workers left behind


def wait_for(what: str, condition, timeout: float, poll: float = 2.0, state=None):
    """Polls `condition` until it is true; on timeout, fails with `state()` (what was seen instead) if given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"; instead: {state()}" if state else ""))


def writer_runs(instance: DagsterInstance, pool: str) -> list:
    """The runs that write a table: those with a step in its writers' pool, whatever job they ran, and for books the
    sync runs (outside the pool: they hand the table over to each other)."""
    return [
        record
        for record in instance.get_run_records()
        if pool in pools_of(record.dagster_run) or (pool == BOOKS_WRITER_POOL and record.dagster_run.job_name == SYNC_JOB_NAME)
    ]


def pools_of(run) -> set[str]:
    concurrency = run.run_op_concurrency
    return set(concurrency.all_pools or ()) if concurrency else set()


def described(runs) -> list[tuple]:
    """Each run's job, status, partition and pools (for an assertion's message)."""
    return [(run.job_name, run.status.value, run.tags.get("dagster/partition"), sorted(pools_of(run))) for run in runs]


def failures(instance: DagsterInstance, records) -> list[str]:
    """What each failed run's log says went wrong (for the assertion's message)."""
    found = []
    for record in records:
        if record.dagster_run.status == DagsterRunStatus.FAILURE:
            errors = [
                e.dagster_event.event_specific_data
                for e in instance.all_logs(record.dagster_run.run_id)
                if e.is_dagster_event and e.dagster_event.is_step_failure
            ]
            found.append(f"{record.dagster_run.job_name} {record.dagster_run.tags.get('dagster/partition')}: {errors or 'no step failed'}")
    return found


def held_spans(instance: DagsterInstance, record, target: str) -> list[tuple[float, float]]:
    """When a run held `target`: from each "Took the writer lease of <target>" in its log to its "Giving <target> up"
    (or the run's end: a load holds its lease to the end). A run of the table's pool that never took the lease, its
    whole run (the pool alone kept it apart); a sync run that never took it held nothing (it gave way, or synced only
    its other tables). A run still queued (a cleanup launched as the test ends) has not started: it held nothing."""
    if record.start_time is None:
        return []
    end = record.end_time or time.time()
    spans, taken = [], None
    for entry in instance.all_logs(record.dagster_run.run_id):
        message = entry.user_message or ""
        if message == f"Took the writer lease of {target}":
            taken = entry.timestamp
        elif message.startswith(f"Giving {target} up") and taken is not None:
            spans.append((taken, entry.timestamp))
            taken = None
    if taken is not None:
        spans.append((taken, end))
    if not spans and record.dagster_run.job_name != SYNC_JOB_NAME:
        spans.append((record.start_time, end))
    return spans


def overlaps(instance: DagsterInstance, records, target: str) -> list[tuple[str, str]]:
    """Pairs of runs that held `target` at the same moment (a sync run starts before its predecessor ends, and takes
    the lease after it; it may give a table up to another writer and sync its other tables meanwhile)."""
    spans = sorted((start, end, record.dagster_run.run_id) for record in records for start, end in held_spans(instance, record, target))
    return [(a[2], b[2]) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1] and a[2] != b[2]]


def iceberg_rows(warehouse: str, namespace: str, table: str) -> list[dict]:
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(str(Path(urlparse(warehouse).path) / namespace / table)).scan().to_arrow().to_pylist()


def dynamodb_items(settings, table: str, key: str) -> dict[str, dict]:
    pages = settings.client("dynamodb").get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    return {item[key]["S"]: item for page in pages for item in page["Items"]}


def run_worker_tree(instance: DagsterInstance, run_id: str) -> list:
    """The process that executes the run (its pid, as the run's log gives it) and its children (the JVM, Spark's
    workers)."""
    for entry in instance.all_logs(run_id):
        found = re.search(r"Executing steps in process \(pid: (\d+)\)", entry.user_message or "")
        if found:
            worker = psutil.Process(int(found.group(1)))
            return [worker, *worker.children(recursive=True)]
    return []


def merges_after(instance: DagsterInstance, moment: float, other_than: str) -> list:
    from dagster import AssetKey

    records = instance.fetch_materializations(AssetKey("books_iceberg"), limit=200, ascending=False).records
    return [
        record
        for record in records
        if record.run_id != other_than and record.timestamp > moment and record.asset_materialization.metadata["files_consumed"].value
    ]


def commits(instance: DagsterInstance) -> list:
    """The books_iceberg materializations that merged changes, oldest first."""
    return sorted(merges_after(instance, 0, other_than=""), key=lambda record: record.timestamp)


def merging_sync(instance: DagsterInstance, alone: bool = False) -> tuple | None:
    """A started sync run whose worker is alive and that has merged, with its worker's pid (the newest such); with
    `alone`, only one no newer sync run follows yet (none on its way to take over from it)."""
    merged = {record.run_id for record in commits(instance)}
    started = instance.get_runs(RunsFilter(job_name=SYNC_JOB_NAME, statuses=[DagsterRunStatus.STARTED]))
    for run in started:  # newest first
        pid = worker_pid(instance, run.run_id)
        if run.run_id in merged and pid is not None and process_alive(pid):
            newer = instance.get_runs(RunsFilter(job_name=SYNC_JOB_NAME, created_after=instance.get_run_record_by_id(run.run_id).create_timestamp))
            return (run, pid) if not alone or all(other.run_id == run.run_id for other in newer) else None
    return None


class BookWrites:
    """A books simulator writing a change every `every` seconds in a thread, from `start()` to `stop()`."""

    def __init__(self, books: BookSimulator, every: float):
        self._books, self._every, self._stop = books, every, threading.Event()
        self._thread = threading.Thread(target=self._write)

    def _write(self) -> None:
        while not self._stop.wait(self._every):
            self._books.step()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


@dataclass(frozen=True)
class SpotInterruption:
    """A sync run stopped as ECS stops a Spot task, and what followed: its record once ended, its successor's."""

    victim: RunRecord
    successor: RunRecord
    signalled: float
    worker_ended_after: float
    successors_first_commit: float
    killed: tuple[str, ...]


def interrupt_like_spot(instance: DagsterInstance, victim_run_id: str, pid: int) -> SpotInterruption:
    """SIGTERM to the run's worker, SIGKILL after the grace (ddb_athena_faults.dagster_api.stop_as_ecs_does), then its
    successor's first commit. The run ended by itself, successfully, and its worker (the task's command) within the
    grace (a JVM still shutting down after it is taken by the container's end, as on ECS); its successor was launched
    by the sensor at once (it looks every 10 s), before the stopped run ended, not at a minute tick."""
    signalled = time.time()
    stopped = stop_as_ecs_does(pid)
    ended = time.time()

    def successors_commits():
        return [commit for commit in commits(instance) if commit.run_id != victim_run_id and commit.timestamp > signalled]

    first = wait_for("the successor's first commit", successors_commits, timeout=300)[0]
    record = instance.get_run_record_by_id(victim_run_id)
    assert record.dagster_run.status == DagsterRunStatus.SUCCESS and stopped.worker_ended, stopped
    assert record.end_time - signalled < STOP_TIMEOUT_SECONDS and INTERRUPTED_TAG in record.dagster_run.tags
    successor = instance.get_run_record_by_id(first.run_id)
    assert successor.dagster_run.tags.get("dagster/sensor_name") == "sync_successor_on_interruption"
    launched_after = successor.create_timestamp.timestamp() - signalled
    print(f"\nSuccessor launched {launched_after:.0f} s after the SIGTERM; the stopped run ended after {record.end_time - signalled:.0f} s")
    assert launched_after < 30 and successor.create_timestamp.timestamp() < ended
    return SpotInterruption(record, successor, signalled, ended - signalled, first.timestamp, stopped.killed)
