"""The real stack (dagster-webserver and dagster-daemon, the schedules and sensors running) as a user meets it, on a
deployment's storage (PostgreSQL, deploy/dagster.yaml's), started once for the tests below, which run in this order
on it: a sync running, Materialize clicked and an orders backfill of two days on a table never loaded, launched over
GraphQL as the UI does; ECS stopping the sync's task (a Spot interruption), which the sync hands over to a successor
started at once; a sync killed with `kill -9`, last. After each, the tables read back with PyIceberg (as Athena reads
them) equal DynamoDB and at most one writer per table held it at once (from the run records and logs). The same with
every run starting 90 s late, as on ECS, is `make test-soak`'s (test_late_starts.py)."""

import os
import random
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as day_time

import psutil
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_graphql import DagsterGraphQLClient

from ddb_athena.dev.local_stack import create_demo_resources
from ddb_athena.dev.simulate import BookSimulator, order_item
from ddb_athena.lib.settings import Settings
from ddb_athena_bench.postgres_server import postgres_server
from ddb_athena_faults.dagster_api import Webserver
from ddb_athena_tests.books_and_orders import BOOKS_WRITER_POOL, ORDERS_WRITER_POOL
from ddb_athena_tests.conftest import Days, away_from_midnight, point_at_emulator
from ddb_athena_tests.stack.helpers import (
    FINISHED,
    REPO,
    BookWrites,
    commits,
    dagster_stack,
    described,
    dynamodb_items,
    failures,
    free_port,
    iceberg_rows,
    interrupt_like_spot,
    merges_after,
    merging_sync,
    overlaps,
    run_worker_tree,
    wait_for,
    writer_runs,
)

# On one worker (`xdist_group`): the tests share this module's stack, in order.
pytestmark = [pytest.mark.stack, pytest.mark.xdist_group("stack")]

# Longer than the backfill test (the first) takes: the stack's emulator turns point-in-time recovery on "today", and
# the backfill's partitions are the days before it. Closer to midnight UTC, the stack waits for the new day.
DAY_MARGIN = timedelta(minutes=10)

LAUNCH_BACKFILL = """
mutation ($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""


@dataclass(frozen=True)
class Stack:
    settings: Settings
    days: Days
    instance: DagsterInstance
    port: int


@pytest.fixture(scope="module")
def stack(moto_endpoint, warehouse, tmp_path_factory):
    """One stack for this module's tests, on PostgreSQL, the sync as deployed (its runs an hour long: a Spot
    interruption's successor is launched by the sensor, none being on its way; its default interval: a cycle's CPU is
    the stack's most, taken from the other worker); started when the first test needs it, stopped after the last."""
    days = away_from_midnight(DAY_MARGIN)
    home = tmp_path_factory.mktemp("dagster_home")
    deployed_storage = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())["storage"]
    with pytest.MonkeyPatch.context() as patch, postgres_server() as postgres:
        point_at_emulator(patch, moto_endpoint, warehouse)
        settings = Settings.from_env()
        create_demo_resources(settings)
        for name, value in postgres.environment().items():
            patch.setenv(name, value)  # the stack's processes and this one's instance read the same storage
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
        }
        port = free_port()
        with dagster_stack(home, port, env, storage=deployed_storage), DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            yield Stack(settings, days, instance, port)


@pytest.fixture
def books_written(stack):
    """Books written every 0.3 s from `start()` (the test's) to `stop()` (before the tables are compared)."""
    books = BookSimulator(stack.settings.client("dynamodb"), stack.settings.dynamodb_tables["books"], rng=random.Random(7))
    for _ in range(10):
        books.insert()
    writes = BookWrites(books, every=0.3)
    yield writes
    writes.stop()


def books_equal_dynamodb(stack: Stack, writes: BookWrites) -> None:
    """Once the writes stop, library.books catches up with DynamoDB; no two runs ever held it at once."""
    writes.stop()
    settings, instance = stack.settings, stack.instance
    expected = dynamodb_items(settings, settings.dynamodb_tables["books"], "id")

    def caught_up():
        rows = iceberg_rows(settings.warehouse, settings.namespace, "books")
        return {row["id"] for row in rows} == set(expected) and len(rows) == len(expected)

    wait_for("library.books to catch up with DynamoDB", caught_up, timeout=180, poll=2)
    assert overlaps(instance, writer_runs(instance, BOOKS_WRITER_POOL), f"{settings.namespace}.books") == []


def test_a_sync_materialize_and_an_orders_backfill_on_a_new_deployment_keep_one_writer_per_table(stack, books_written):
    settings, days, instance = stack.settings, stack.days, stack.instance
    dynamodb = settings.client("dynamodb")
    rng = random.Random(3)
    partitions = [(days.today - timedelta(days=back)).isoformat() for back in (2, 1)]
    for partition in partitions:
        for hour in range(0, 24, 6):
            created = datetime.combine(datetime.fromisoformat(partition).date(), day_time(hour), tzinfo=UTC)
            dynamodb.put_item(TableName=settings.dynamodb_tables["orders"], Item=order_item(rng, created))

    client = DagsterGraphQLClient("127.0.0.1", port_number=stack.port)
    Webserver(f"http://127.0.0.1:{stack.port}").wait_until_serving(timeout_seconds=120)
    # The UI's backfill of two days of orders, on a table never loaded: launched at once, its runs go on while the
    # minute schedule starts the sync.
    launched = client._execute(
        LAUNCH_BACKFILL,
        {"params": {"assetSelection": [{"path": ["orders_export"]}, {"path": ["orders_athena"]}], "partitionNames": partitions}},
    )["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched

    def sync_started():
        return instance.get_runs(RunsFilter(job_name="books_sync", statuses=[DagsterRunStatus.STARTED]))

    wait_for("the minute schedule to start a books_sync run", sync_started, timeout=240)
    books_written.start()
    # Materialize on books_iceberg beside the sync, as the UI's button launches it: the implicit asset job, default config.
    materialize_run = client.submit_job_execution("__ASSET_JOB", asset_selection=[["books_source"], ["books_iceberg"]])

    def backfill_runs():
        return instance.get_runs(RunsFilter(tags={"dagster/backfill": launched["backfillId"]}))

    def orders_done():
        runs = backfill_runs()
        return len(runs) == len(partitions) and all(run.status in FINISHED for run in runs)

    def orders_state():
        pool = [record.dagster_run for record in writer_runs(instance, ORDERS_WRITER_POOL)]
        return {"backfill": described(backfill_runs()), "orders writers' pool": described(pool)}

    # The backfill's own runs (by its tag): a wait for exactly two runs in the orders writers' pool never
    # ended once the sensor had launched an export's cleanup (in the pool too) before it looked.
    wait_for("the backfill's two runs", orders_done, timeout=600, poll=2, state=orders_state)
    wait_for("Materialize's run", lambda: instance.get_run_by_id(materialize_run).status in FINISHED, timeout=300)

    assert instance.get_run_by_id(materialize_run).status == DagsterRunStatus.SUCCESS
    # The sync gave books up to Materialize and took it again after: it merges the writes made since.
    materialized = instance.get_run_record_by_id(materialize_run)

    def merged_after_materialize():
        return [commit for commit in commits(instance) if commit.run_id != materialize_run and commit.timestamp > materialized.end_time]

    wait_for("the sync to merge after Materialize's run", merged_after_materialize, timeout=180)
    backfill = backfill_runs()
    assert {run.status for run in backfill} == {DagsterRunStatus.SUCCESS}, described(backfill)
    assert sorted(run.tags["dagster/partition"] for run in backfill) == partitions
    # The pool holds the export cleanups too (each after a load, launched by a sensor: one may still be queued).
    orders_runs = writer_runs(instance, ORDERS_WRITER_POOL)
    ended_badly = [record for record in orders_runs if record.dagster_run.status in FINISHED - {DagsterRunStatus.SUCCESS}]
    assert not ended_badly, (failures(instance, ended_badly), described([record.dagster_run for record in orders_runs]))
    assert overlaps(instance, orders_runs, f"{settings.namespace}.orders") == []
    books_equal_dynamodb(stack, books_written)
    rows = iceberg_rows(settings.warehouse, settings.namespace, "orders")
    order_ids = [row["order_id"] for row in rows]
    assert len(order_ids) == len(set(order_ids)) == len(dynamodb_items(settings, settings.dynamodb_tables["orders"], "order_id")) == 8
    table_arn = dynamodb.describe_table(TableName=settings.dynamodb_tables["orders"])["Table"]["TableArn"]
    exports = dynamodb.list_exports(TableArn=table_arn)["ExportSummaries"]
    assert len(exports) == 1  # one full export, whatever the partitions' order


def test_ecs_stopping_the_syncs_task_costs_a_handover_and_loses_nothing(stack, books_written):
    """A Fargate Spot interruption as ECS delivers it: SIGTERM to the run worker, SIGKILL 120 s later. The run syncs on,
    its successor is launched at once by the sensor (not at a minute tick, not after the run ended), and the run ends
    by itself before the kill, successfully; nothing is lost."""
    instance = stack.instance
    books_written.start()
    victim, pid = wait_for("a sync run merging, no successor on its way", lambda: merging_sync(instance, alone=True), timeout=240)
    stopped = interrupt_like_spot(instance, victim.run_id, pid)
    record, successor = stopped.victim, stopped.successor
    # The stopped run rides the signal out, cycling, and hands over to its successor once that one is ready (a cycle
    # begins by asking): the successor's start slowed by the other worker's JVMs here, or by an ECS task's start delay
    # (test_late_starts.py), may miss the stopped run's last cycle before the kill; the run then ends by itself all the same.
    ready_at = next(entry.timestamp for entry in instance.all_logs(successor.dagster_run.run_id) if (entry.user_message or "").startswith("Ready to sync"))
    handed_over = any(
        f"the next sync run {successor.dagster_run.run_id} is ready and takes over" in (entry.user_message or "") for entry in instance.all_logs(victim.run_id)
    )
    ridden_out = [commit.timestamp for commit in commits(instance) if commit.run_id == victim.run_id and commit.timestamp > stopped.signalled]
    print(f"Successor ready {ready_at - stopped.signalled:.0f} s after the SIGTERM; the stopped run committed {len(ridden_out)} times after it")
    assert successor.start_time < ready_at
    assert ridden_out or handed_over
    if len(ridden_out) >= 2 and ready_at < ridden_out[-2]:
        assert handed_over  # ready before the stopped run's last cycle began
    if handed_over:
        assert ready_at < record.end_time
    books_equal_dynamodb(stack, books_written)


def test_a_sync_killed_under_writes_is_replaced_within_two_minutes_and_loses_nothing(stack, books_written):
    instance = stack.instance

    victim, _ = wait_for("a sync run merging", lambda: merging_sync(instance), timeout=240)
    books_written.start()
    time.sleep(6)  # killed under writes: ~20 of them, not all merged yet (its interval is 30 s)
    processes = wait_for("the sync's run worker", lambda: run_worker_tree(instance, victim.run_id), timeout=30)
    for process in processes:
        with suppress(psutil.NoSuchProcess):  # a child that ended on its own, or with its parent
            process.kill()  # kill -9: no handler runs, the lease is not released, the run is not marked ended
    killed_at, killed_on_monotonic = time.time(), time.monotonic()
    wait_for("another sync run merging", lambda: merges_after(instance, killed_at, victim.run_id), timeout=300, poll=2)
    # Timed on this process's monotonic clock (an upper bound by one poll): a wall clock stepped forward mid-test (a
    # CI machine's did, by ~330 s) is no slower replacement.
    replaced_within = time.monotonic() - killed_on_monotonic
    print(f"\nA new sync merged within {replaced_within:.0f} s of the kill")
    assert replaced_within < 120
    # Found dead, not left STARTED.
    wait_for("the killed run marked failed", lambda: instance.get_run_by_id(victim.run_id).status == DagsterRunStatus.FAILURE, timeout=60)
    books_equal_dynamodb(stack, books_written)
