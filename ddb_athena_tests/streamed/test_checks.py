"""The books checks turn red for the right reasons, and only then."""

from functools import partial

import pytest
from dagster import AssetCheckSeverity, DagsterInstance, Definitions

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lake.table_keys import item_key
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import change_file_name
from ddb_athena.streamed.check_results import cycle_check_results, key_parity_readers
from ddb_athena.streamed.key_parity import EXTRA, MISSING, ParityTracker
from ddb_athena_tests.books_and_orders import books_backlog, books_key_parity, books_row_count_parity, books_unique_id
from ddb_athena_tests.books_and_orders import sync_books as books_sync_assets
from ddb_athena_tests.dagster_helpers import books_synced, check_results, local_resources, materialization_metadata, sync_books
from ddb_athena_tests.fake_clock import FakeClock
from ddb_athena_tests.lake.helpers import T0

BOOKS = declared("books")


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


def test_checks_pass_on_a_healthy_sync_and_fail_on_bad_input_backlog_and_drift(spark, settings, instance):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    for _ in range(5):
        simulator.insert()
    healthy = check_results(sync_books(instance))
    assert all(result.passed for result in healthy.values()), healthy
    # The cycle's checks list S3 only; the whole-table checks are the daily run's (unique keys and parity).
    assert set(healthy) == {"books_backlog", "books_quarantine_empty"}
    resources = local_resources()
    unique = books_unique_id(spark=resources["spark"], sync=resources["sync"])
    assert unique.passed and unique.metadata["rows"].value == 5
    parity = books_row_count_parity(aws=resources["aws"], spark=resources["spark"], sync=resources["sync"])
    assert parity.passed and parity.metadata["iceberg_rows"].value == 5
    # What the scan cost, as DynamoDB reports it.
    assert parity.metadata["dynamodb_scans"].value == 1 and parity.metadata["dynamodb_read_units"].value > 0

    # A malformed change file: quarantined, the check turns red, the rest still merges.
    layout = SourceLayout(settings.bucket, "books_source")
    s3.put_object(Bucket=settings.bucket, Key=layout.changes_prefix + change_file_name(T0, "lambda"), Body=b"<html>oops</html>\n")
    simulator.insert()
    after_bad_file = check_results(sync_books(instance))
    assert not after_bad_file["books_quarantine_empty"].passed
    assert after_bad_file["books_quarantine_empty"].metadata["quarantined_records"].value == 1
    assert "not valid JSON" in after_bad_file["books_quarantine_empty"].metadata["reasons"].value
    assert books_unique_id(spark=resources["spark"], sync=resources["sync"]).metadata["rows"].value == 6  # the good change was merged

    # An item no sync merges (none runs) differs longer than the settle time: the check, run on its own, waits
    # that long for it and then warns. A backlog past the bound fails.
    dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": "sneaky"}})
    s3.put_object(Bucket=settings.bucket, Key=layout.changes_prefix + change_file_name(T0, "lambda"), Body=b"")
    resources = local_resources(backlog_limit_minutes=0, parity_settle_seconds=2)
    backlog = books_backlog(aws=resources["aws"], sync=resources["sync"])
    assert not backlog.passed and backlog.metadata["unmerged_files"].value == 1
    parity = books_row_count_parity(aws=resources["aws"], spark=resources["spark"], sync=resources["sync"])
    assert not parity.passed and parity.severity == AssetCheckSeverity.WARN
    assert parity.metadata["difference"].value == -1 and parity.metadata["unexplained_keys"].value == 1
    assert parity.metadata["unexplained_examples"].value == "sneaky (missing from Iceberg)"


def test_parity_tells_a_change_in_flight_from_a_row_deleted_by_hand(spark, settings, instance):
    simulator = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"])
    for _ in range(4):
        simulator.insert()
    sync_books(instance)
    resources = local_resources(parity_settle_seconds=1)
    aws, spark_resource, sync = resources["aws"], resources["spark"], resources["sync"]
    tracker = ParityTracker(settle_seconds=30)

    readers = key_parity_readers(aws, spark_resource, sync, BOOKS, [])

    # Written after the merge, before the check's scan: in flight, and merged by the next cycle.
    simulator.insert("book-in-flight")
    first = tracker.observe(readers)
    assert first.passed and first.in_flight == {("book-in-flight",): MISSING}
    sync_books(instance)
    assert tracker.observe(readers).in_flight == {}

    # A row deleted from the table by hand (as with a DELETE in Athena): no change will ever bring it back.
    (victim,) = spark.sql(f"SELECT id FROM {settings.namespace}.books LIMIT 1").collect()[0]
    spark.sql(f"DELETE FROM {settings.namespace}.books WHERE id = '{victim}'")
    check = books_row_count_parity(aws=aws, spark=spark_resource, sync=sync)
    assert not check.passed and check.metadata["unexplained_keys"].value == 1
    assert check.metadata["unexplained_examples"].value == f"{victim} (missing from Iceberg)"


def test_a_key_changed_again_between_two_looks_is_in_flight_at_both_and_stuck_only_when_nothing_merged(spark, settings, instance):
    dynamodb = settings.client("dynamodb")
    books_synced(settings, instance, "book-a", "book-b")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    resources = local_resources()
    # No settle time: a key that differs the same way at two looks is stuck, unless a change was merged for it.
    tracker = ParityTracker(settle_seconds=0)

    readers = key_parity_readers(resources["aws"], resources["spark"], resources["sync"], BOOKS, [])

    def look():
        return tracker.observe(readers)

    def delete(book_id):
        dynamodb.delete_item(TableName=settings.dynamodb_tables["books"], Key={"id": {"S": book_id}})

    simulator.insert("book-c")  # in flight at the first look: missing from Iceberg
    delete("book-b")  # in flight: only in Iceberg
    assert look().in_flight == {("book-c",): MISSING, ("book-b",): EXTRA}
    sync_books(instance)
    delete("book-c")
    simulator.insert("book-b")
    sync_books(instance)
    simulator.insert("book-c")  # in flight again, the same way, after a merged delete
    delete("book-b")  # in flight again, the same way, from another row
    again = look()
    assert again.passed and again.in_flight == {("book-c",): MISSING, ("book-b",): EXTRA}
    stuck = look()  # nothing merged since
    assert not stuck.passed and stuck.unexplained == {("book-c",): MISSING, ("book-b",): EXTRA}


def test_the_daily_run_checks_parity_and_unique_keys_and_a_key_written_twice_turns_unique_keys_red(spark, settings, instance):
    """The whole-table checks are the daily run's (books_key_parity, by its schedule), not the sync's cycles."""
    simulator = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"])
    for _ in range(3):
        simulator.insert()
    sync_books(instance)
    daily = Definitions(
        assets=[books_sync_assets], asset_checks=[books_row_count_parity, books_unique_id], jobs=[books_key_parity], resources=local_resources()
    )

    def run_daily() -> dict:
        result = daily.resolve_job_def(books_key_parity.name).execute_in_process(instance=instance)
        return {evaluation.check_name: evaluation for evaluation in result.get_asset_check_evaluations()}

    healthy = run_daily()
    assert set(healthy) == {"books_row_count_parity", "books_unique_id"} and all(e.passed for e in healthy.values()), healthy
    # A row written twice for one key (what a broken merge would leave): red, saying how many rows are extra.
    spark.sql(f"INSERT INTO {settings.namespace}.books SELECT * FROM {settings.namespace}.books LIMIT 1")
    duplicated = run_daily()["books_unique_id"]
    assert not duplicated.passed and duplicated.metadata["rows"].value == 4 and duplicated.metadata["duplicate_rows"].value == 1, duplicated.metadata


def test_a_foreign_file_in_the_change_prefix_is_quarantined_turns_the_check_red_and_the_rest_flows(spark, settings, instance):
    s3 = settings.client("s3")
    simulator = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"])
    simulator.insert()
    sync_books(instance)
    layout = SourceLayout(settings.bucket, "books_source")
    # Another producer's file (a Firehose's name): not a change file name, so the merge would never take it.
    stray = layout.changes_prefix + "books-firehose-1-2026-11-23-00-01-02-0a1b2c3d"
    s3.put_object(Bucket=settings.bucket, Key=stray, Body=b'{"event_name": "INSERT"}\n')
    simulator.insert()
    result = sync_books(instance)
    checks = check_results(result)
    assert not checks["books_quarantine_empty"].passed
    assert "not a change file" in checks["books_quarantine_empty"].metadata["reasons"].value
    assert materialization_metadata(result, "books_iceberg")["foreign_files_quarantined"] == 1
    assert checks["books_backlog"].passed and materialization_metadata(result, "books_iceberg")["rows_written"] == 1  # the real change merged
    assert "Contents" not in s3.list_objects_v2(Bucket=settings.bucket, Prefix=stray)
    # It stays red on later runs until someone deals with it, and it is quarantined once.
    later = sync_books(instance)
    assert not check_results(later)["books_quarantine_empty"].passed
    assert materialization_metadata(later, "books_iceberg")["foreign_files_quarantined"] == 0


class PagedScan:
    """A DynamoDB client whose scans return `pages` pages of one key each per segment, each consuming `units`."""

    def __init__(self, pages: int, units: float, provisioned: int = 0):
        self.pages, self.units, self.provisioned, self.requests = pages, units, provisioned, []

    def describe_table(self, TableName):
        return {"Table": {"ProvisionedThroughput": {"ReadCapacityUnits": self.provisioned}}}

    def get_paginator(self, operation):
        client = self

        class Pages:
            def paginate(self, **kwargs):
                client.requests.append(kwargs)
                for number in range(client.pages):
                    key = f"s{kwargs['Segment']}-{number}"
                    yield {"Items": [{"id": {"S": key}}], "ConsumedCapacity": {"CapacityUnits": client.units}}

        return Pages()


def test_the_item_scan_is_segmented_eventually_consistent_and_paced_to_its_read_rate():
    from ddb_athena.streamed.key_parity import item_digest, paced_item_digests, scan_plan

    # On demand: the configured rate. Provisioned: a share of the table's read capacity, never above that rate.
    assert scan_plan(PagedScan(1, 1), "books", 0.1, 100).read_units_per_second == 100
    assert scan_plan(PagedScan(1, 1, provisioned=200), "books", 0.1, 100).read_units_per_second == 20
    dynamodb, clock, pages = PagedScan(pages=10, units=50.0), FakeClock(), []
    scan = paced_item_digests(
        dynamodb, "books", partial(item_key, declared("books").spec), read_units_per_second=20, sink=pages.append, segments=4, clock=clock, sleep=clock.sleep
    )
    assert scan.items == 40 and scan.read_units == 2000 and scan.pages == 40 and len(pages) == 40
    # Whole items (a projection would cost the same units), handed on as digests only, a page at a time.
    assert pages[0] == [(("s0-0",), item_digest({"id": {"S": "s0-0"}}))] and all("ProjectionExpression" not in request for request in dynamodb.requests)
    assert scan.seconds >= 2000 / 20 - 50 / 20  # every page but the last waited its share
    assert scan.read_units / scan.seconds <= 20 * 1.05
    assert [request["Segment"] for request in dynamodb.requests] == [0, 1, 2, 3]
    assert all(request["ReturnConsumedCapacity"] == "TOTAL" and "ConsistentRead" not in request for request in dynamodb.requests)


def test_between_periodic_cycles_the_s3_checks_run_only_when_the_cycle_found_trouble(settings):
    resources = local_resources()
    aws, sync = resources["aws"], resources["sync"]
    assert cycle_check_results(aws, sync, BOOKS, list_s3=False) == {}
    # Behind the stream: the backlog at once, with how far; a quarantine in the cycle: the quarantine check at once.
    behind = cycle_check_results(aws, sync, BOOKS, stream_lag_seconds=12.0, list_s3=False)
    assert set(behind) == {"books_backlog"} and behind["books_backlog"].metadata["stream_behind_seconds"].value == 12.0
    quarantined = cycle_check_results(aws, sync, BOOKS, list_s3=False, quarantined=True)
    assert set(quarantined) == {"books_quarantine_empty"}
    assert set(cycle_check_results(aws, sync, BOOKS)) == {"books_backlog", "books_quarantine_empty"}
