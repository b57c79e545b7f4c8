"""The real stack (dagster-webserver and dagster-daemon, the schedules and sensors running) as a user meets it: a
sync running, Materialize clicked, an orders backfill of three days on a table never loaded, launched over GraphQL as
the UI does, on a deployment's storage (PostgreSQL, deploy/dagster.yaml's). Then the tables, read back with PyIceberg
(as Athena reads them), equal DynamoDB; at most one writer per table ever held it at once (from the run records and
logs); one full export was paid."""

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from datetime import time as day_time
from pathlib import Path
from urllib.parse import urlparse

import psutil
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_graphql import DagsterGraphQLClient

from ddb_athena.dev.local_runs import limit_writer_pools
from ddb_athena.dev.simulate import BookSimulator, order_item
from ddb_athena.lib.writer_lease import WRITER_POOLS
from ddb_athena.streamed.handover import SYNC_JOB_NAME
from ddb_athena_bench.postgres_server import postgres_server
from ddb_athena_tests.books_and_orders import BOOKS_WRITER_POOL, ORDERS_WRITER_POOL

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}

# One at a time, on one worker: two stacks at once on two cores would time each other out.
pytestmark = [pytest.mark.stack, pytest.mark.xdist_group("stack"), pytest.mark.usefixtures("days")]

LAUNCH_BACKFILL = """
mutation ($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""


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


def test_a_sync_materialize_and_an_orders_backfill_on_a_new_deployment_keep_one_writer_per_table(settings, days, tmp_path, monkeypatch):
    dynamodb = settings.client("dynamodb")
    books = BookSimulator(dynamodb, settings.dynamodb_tables["books"], rng=random.Random(7))
    for _ in range(20):
        books.insert()
    rng = random.Random(3)
    partitions = [(days.today - timedelta(days=back)).isoformat() for back in (3, 2, 1)]
    for partition in partitions:
        for hour in range(0, 24, 6):
            created = datetime.combine(datetime.fromisoformat(partition).date(), day_time(hour), tzinfo=UTC)
            dynamodb.put_item(TableName=settings.dynamodb_tables["orders"], Item=order_item(rng, created))

    port = free_port()
    deployed_storage = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())["storage"]
    with postgres_server() as postgres:
        for name, value in postgres.environment().items():
            monkeypatch.setenv(name, value)  # the stack's processes and this one's instance read the same storage
        env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "DDB_ATHENA_SYNC_RUN_MINUTES": "1.5"}
        with dagster_stack(tmp_path, port, env, storage=deployed_storage), DagsterInstance.from_config(str(tmp_path)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"

            def sync_started():
                return instance.get_runs(RunsFilter(job_name="books_sync", statuses=[DagsterRunStatus.STARTED]))

            wait_for("the minute schedule to start a books_sync run", sync_started, timeout=240)
            stop_writing = threading.Event()

            def write():
                while not stop_writing.wait(0.3):
                    books.step()

            writer = threading.Thread(target=write)
            writer.start()
            try:
                client = DagsterGraphQLClient("127.0.0.1", port_number=port)
                # Materialize on books_iceberg, as the UI's button launches it: the implicit asset job, default config.
                materialize_run = client.submit_job_execution("__ASSET_JOB", asset_selection=[["books_source"], ["books_iceberg"]])
                # The UI's backfill of three days of orders, on a table never loaded.
                launched = client._execute(
                    LAUNCH_BACKFILL,
                    {"params": {"assetSelection": [{"path": ["orders_export"]}, {"path": ["orders_athena"]}], "partitionNames": partitions}},
                )["launchPartitionBackfill"]
                assert launched["__typename"] == "LaunchBackfillSuccess", launched

                def backfill_runs():
                    return instance.get_runs(RunsFilter(tags={"dagster/backfill": launched["backfillId"]}))

                def orders_done():
                    runs = backfill_runs()
                    return len(runs) == 3 and all(run.status in FINISHED for run in runs)

                def orders_state():
                    pool = [record.dagster_run for record in writer_runs(instance, ORDERS_WRITER_POOL)]
                    return {"backfill": described(backfill_runs()), "orders writers' pool": described(pool)}

                # The backfill's own runs (by its tag): a wait for exactly three runs in the orders writers' pool never
                # ended once the sensor had launched an export's cleanup (in the pool too) before it looked.
                wait_for("the backfill's three runs", orders_done, timeout=600, poll=5, state=orders_state)
                wait_for("Materialize's run", lambda: instance.get_run_by_id(materialize_run).status in FINISHED, timeout=300)
                time.sleep(20)  # writes beside the sync that resumed after Materialize
            finally:
                stop_writing.set()
                writer.join()

            assert instance.get_run_by_id(materialize_run).status == DagsterRunStatus.SUCCESS
            backfill = backfill_runs()
            assert {run.status for run in backfill} == {DagsterRunStatus.SUCCESS}, described(backfill)
            assert sorted(run.tags["dagster/partition"] for run in backfill) == partitions
            # The pool holds the export cleanups too (each after a load, launched by a sensor: one may still be queued).
            orders_runs = writer_runs(instance, ORDERS_WRITER_POOL)
            ended_badly = [record for record in orders_runs if record.dagster_run.status in FINISHED - {DagsterRunStatus.SUCCESS}]
            assert not ended_badly, (failures(instance, ended_badly), described([record.dagster_run for record in orders_runs]))

            expected_books = dynamodb_items(settings, settings.dynamodb_tables["books"], "id")

            def books_caught_up():
                rows = iceberg_rows(settings.warehouse, settings.namespace, "books")
                return {row["id"] for row in rows} == set(expected_books) and len(rows) == len(expected_books)

            wait_for("library.books to catch up with DynamoDB", books_caught_up, timeout=180, poll=5)
            books_runs = writer_runs(instance, BOOKS_WRITER_POOL)
            assert len(books_runs) >= 3  # the sync, Materialize, the sync after it

            books, orders = f"{settings.namespace}.books", f"{settings.namespace}.orders"
            assert overlaps(instance, books_runs, books) == [] and overlaps(instance, orders_runs, orders) == []

    rows = iceberg_rows(settings.warehouse, settings.namespace, "orders")
    order_ids = [row["order_id"] for row in rows]
    assert len(order_ids) == len(set(order_ids)) == len(dynamodb_items(settings, settings.dynamodb_tables["orders"], "order_id")) == 12
    table_arn = dynamodb.describe_table(TableName=settings.dynamodb_tables["orders"])["Table"]["TableArn"]
    exports = dynamodb.list_exports(TableArn=table_arn)["ExportSummaries"]
    assert len(exports) == 1  # one full export, whatever the partitions' order


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


def test_a_sync_killed_under_writes_is_replaced_within_two_minutes_and_loses_nothing(settings, tmp_path):
    dynamodb = settings.client("dynamodb")
    books = BookSimulator(dynamodb, settings.dynamodb_tables["books"], rng=random.Random(11))
    for _ in range(10):
        books.insert()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    port = free_port()
    with dagster_stack(tmp_path, port, env), DagsterInstance.from_config(str(tmp_path)) as instance:

        def merging_sync():
            running = instance.get_runs(RunsFilter(job_name="books_sync", statuses=[DagsterRunStatus.STARTED]))
            return running and merges_after(instance, 0, other_than="") and running[0]

        stop_writing = threading.Event()

        def write():
            while not stop_writing.wait(0.3):
                books.step()

        writer = threading.Thread(target=write)
        try:
            victim = wait_for("a books_sync run merging", merging_sync, timeout=240)
            writer.start()
            time.sleep(15)
            processes = wait_for("the sync's run worker", lambda: run_worker_tree(instance, victim.run_id), timeout=30)
            for process in processes:
                with suppress(psutil.NoSuchProcess):  # a child that ended on its own, or with its parent
                    process.kill()  # kill -9: no handler runs, the lease is not released, the run is not marked ended
            killed_at = time.time()
            (replacement,) = wait_for("another sync run merging", lambda: merges_after(instance, killed_at, victim.run_id)[-1:], timeout=300, poll=2)
            replaced_after = replacement.timestamp - killed_at
            print(f"\nA new sync merged {replaced_after:.0f} s after the kill")
            assert replaced_after < 120
            time.sleep(10)
        finally:
            stop_writing.set()
            if writer.is_alive():
                writer.join()
        assert instance.get_run_by_id(victim.run_id).status == DagsterRunStatus.FAILURE  # found dead, not left STARTED

        expected = dynamodb_items(settings, settings.dynamodb_tables["books"], "id")

        def caught_up():
            return {row["id"] for row in iceberg_rows(settings.warehouse, settings.namespace, "books")} == set(expected)

        wait_for("library.books to catch up with DynamoDB", caught_up, timeout=120, poll=5)
