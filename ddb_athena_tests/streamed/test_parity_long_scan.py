"""The daily parity check on a table whose scan outlasts the settle time: a key that differs from DynamoDB (missing,
extra or with another value) and that no change will repair turns it red; a key whose change is merged between the
scan and the second look does not."""

from types import SimpleNamespace

import pytest
from dagster import DagsterInstance

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lib.declarations import declared
from ddb_athena.streamed.check_results import key_parity_readers
from ddb_athena.streamed.key_parity import DIFFERENT, EXTRA, MISSING, ParityTracker
from ddb_athena_tests.books_and_orders import books_row_count_parity
from ddb_athena_tests.dagster_helpers import books_synced, local_resources, sync_books

BOOKS = declared("books")

SETTLE_SECONDS = 1.0


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


def slow_scan_resources(**options) -> dict:
    # The emulator reports a read unit a scan page: four segments of a page each, paced to 1.25 units a second, take
    # 3.2 s, more than twice the settle time, as a scan of millions of items at 100 units a second outlasts a minute.
    return local_resources(parity_settle_seconds=SETTLE_SECONDS, parity_scan_read_units_per_second=1.25, parity_scan_segments=4, **options)


def update_name(dynamodb, table: str, book_id: str, name: str) -> None:
    dynamodb.update_item(
        TableName=table,
        Key={"id": {"S": book_id}},
        UpdateExpression="SET #name = :name",
        ExpressionAttributeNames={"#name": "name"},
        ExpressionAttributeValues={":name": {"S": name}},
    )


def test_missing_extra_and_changed_keys_turn_the_check_red_though_the_scan_outlasts_the_settle_time(spark, settings, instance):
    dynamodb = settings.client("dynamodb")
    books_synced(settings, instance, *(f"book-{number:02d}" for number in range(12)))
    # Three divergences no change will repair (no sync runs after them): a row deleted from the table by hand, and a
    # delete and an update whose stream records were lost.
    spark.sql(f"DELETE FROM {settings.namespace}.books WHERE id = 'book-01'")
    dynamodb.delete_item(TableName=settings.dynamodb_tables["books"], Key={"id": {"S": "book-02"}})
    update_name(dynamodb, settings.dynamodb_tables["books"], "book-03", "A Title The Table Never Saw")

    resources = slow_scan_resources()
    check = books_row_count_parity(aws=resources["aws"], spark=resources["spark"], sync=resources["sync"])
    assert check.metadata["dynamodb_scan_seconds"].value > 2 * SETTLE_SECONDS  # the premise: a long scan
    assert not check.passed
    assert check.metadata["unexplained_keys"].value == 3
    assert check.metadata["unexplained_examples"].value == ("book-01 (missing from Iceberg), book-02 (only in Iceberg), book-03 (differs in value)")
    assert check.metadata["dynamodb_scans"].value == 1  # the second look re-reads the table, not DynamoDB


def test_a_healthy_table_passes_with_a_long_scan_every_item_reading_the_same_on_both_sides(spark, settings, instance):
    books_synced(settings, instance, *(f"book-{number:02d}" for number in range(8)))
    resources = slow_scan_resources()
    healthy = books_row_count_parity(aws=resources["aws"], spark=resources["spark"], sync=resources["sync"])
    # Every item's value, every DynamoDB type in it (sets, binary, maps, lists), reads the same from both sides.
    assert healthy.passed and healthy.metadata["keys_in_flight"].value == 0 and healthy.metadata["iceberg_rows"].value == 8


def test_a_value_merged_or_changed_again_after_the_scan_is_in_flight_and_one_the_table_never_merges_is_divergence(spark, settings, instance):
    dynamodb = settings.client("dynamodb")
    books_synced(settings, instance, "book-a", "book-b")
    resources = local_resources()
    readers = key_parity_readers(resources["aws"], resources["spark"], resources["sync"], BOOKS, [])
    # No settle time: a key the table still holds as it did before the scan is divergence at the second look.
    tracker = ParityTracker(settle_seconds=0)

    for book_id in ("book-a", "book-b"):
        update_name(dynamodb, settings.dynamodb_tables["books"], book_id, "Second Title")  # in flight at the scan
    first = tracker.observe(readers)
    assert first.passed and first.in_flight == {("book-a",): DIFFERENT, ("book-b",): DIFFERENT}
    update_name(dynamodb, settings.dynamodb_tables["books"], "book-b", "Third Title")  # changed again after the scan
    sync_books(instance)
    # book-a's row now holds what the scan read: merged. book-b's holds a later change: in flight, not divergence.
    second = tracker.recheck(readers)
    assert second.passed and second.in_flight == {("book-b",): DIFFERENT} and second.unexplained == {}

    update_name(dynamodb, settings.dynamodb_tables["books"], "book-a", "Lost Title")  # a change no sync merges
    assert tracker.observe(readers).in_flight == {("book-a",): DIFFERENT}
    stuck = tracker.recheck(readers)
    assert not stuck.passed and stuck.unexplained == {("book-a",): DIFFERENT}


def test_changes_the_sync_merges_in_its_own_process_reach_the_checks_second_look(spark, settings, instance):
    """The check runs apart from the sync (its own run, books_key_parity): the sync's commits reach it only through the
    catalog. Its Spark keeps the copy of the table it loaded for as long as it reads it every 30 s (Iceberg's
    CachingCatalog expires entries after access), and the second looks come every few seconds: unless they refresh it,
    they see the table of the whole look, and every change in flight at the scan turns red. The check's Spark here is a
    session of its own, with its own catalog and cache, as another process's would be."""
    dynamodb, table = settings.client("dynamodb"), settings.dynamodb_tables["books"]
    books_synced(settings, instance, "book-a")
    resources = local_resources()
    check_run = SimpleNamespace(spark_session=spark.newSession())
    readers = key_parity_readers(resources["aws"], check_run, resources["sync"], BOOKS, [])
    tracker = ParityTracker(settle_seconds=0)  # a key the table still holds as before the scan is divergence
    # The check's run has read the table before its look (its copy cached), and the sync commits after that.
    check_run.spark_session.table(f"{settings.namespace}.books").count()
    books_synced(settings, instance, "book-b")

    # In flight at the scan: an update, a delete and two inserts.
    update_name(dynamodb, table, "book-a", "Second Title")
    dynamodb.delete_item(TableName=table, Key={"id": {"S": "book-b"}})
    for book_id in ("book-c", "book-d"):
        BookSimulator(dynamodb, table).insert(book_id)
    first = tracker.observe(readers)
    assert first.in_flight == {("book-a",): DIFFERENT, ("book-b",): EXTRA, ("book-c",): MISSING, ("book-d",): MISSING}
    # Deleted after the scan: the sync merges its insert and delete, so the table holds a newer tombstone (its own table).
    dynamodb.delete_item(TableName=table, Key={"id": {"S": "book-d"}})
    sync_books(instance)  # the sync's session: its own catalog
    second = tracker.recheck(readers)
    assert second.passed and second.in_flight == {("book-d",): MISSING} and second.unexplained == {}
