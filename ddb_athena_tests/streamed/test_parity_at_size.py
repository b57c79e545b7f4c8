"""The parity check at size: the driver holds no row or item per key (Spark compares the sides and returns only the
keys that differ, at most a cap of them), and a scan that would outlast the day between two checks is refused before
it reads anything."""

import tracemalloc
from functools import partial

import pytest
from dagster import DagsterInstance
from pyspark.sql import DataFrame

from ddb_athena.lake.table_keys import item_key
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.resources import SyncSettings
from ddb_athena.streamed.check_results import key_parity_check
from ddb_athena.streamed.key_parity import paced_item_digests, scan_plan
from ddb_athena.streamed.parity_look import write_pairs
from ddb_athena_bench.bootstrap_memory import GeneratedScan
from ddb_athena_tests.books_and_orders import books_row_count_parity
from ddb_athena_tests.dagster_helpers import books_synced, local_resources
from ddb_athena_tests.streamed.test_parity_long_scan import update_name

BOOKS = declared("books")
TEN_GB = 10 * 10**9


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def collected_rows(monkeypatch) -> list[int]:
    """The number of rows each DataFrame.collect in the test brought to the driver (first, head and take collect)."""
    counts, collect = [], DataFrame.collect

    def counting_collect(self):
        rows = collect(self)
        counts.append(len(rows))
        return rows

    monkeypatch.setattr(DataFrame, "collect", counting_collect)
    return counts


def test_a_healthy_table_is_compared_without_bringing_its_rows_to_the_driver(spark, settings, instance, collected_rows):
    books_synced(settings, instance, *(f"book-{number:02d}" for number in range(30)))
    collected_rows.clear()  # the sync's own
    resources = local_resources()
    check = books_row_count_parity(aws=resources["aws"], spark=resources["spark"], sync=resources["sync"])
    assert check.passed and check.metadata["iceberg_rows"].value == check.metadata["dynamodb_items"].value == 30
    # One row of counts, none a key: the old comparison brought every row's key, version and digest (30).
    assert sum(collected_rows) <= 1, collected_rows
    # The scan's plan and what it took, beside each other.
    assert check.metadata["dynamodb_scan_estimated_seconds"].value >= 0 and check.metadata["dynamodb_scan_seconds"].value > 0
    assert check.metadata["dynamodb_read_units_per_second"].value == 1000


def test_divergence_is_named_through_spark_and_keys_past_the_cap_are_counted_and_fail_the_check(spark, settings, instance):
    dynamodb, table = settings.client("dynamodb"), settings.dynamodb_tables["books"]
    books_synced(settings, instance, *(f"book-{number:02d}" for number in range(6)))
    spark.sql(f"DELETE FROM {settings.namespace}.books WHERE id = 'book-01'")  # by hand
    update_name(dynamodb, table, "book-03", "A Title The Table Never Saw")  # a lost update
    dynamodb.delete_item(TableName=table, Key={"id": {"S": "book-04"}})  # a lost delete

    resources = local_resources(parity_settle_seconds=1, parity_max_tracked_keys=2)
    check = books_row_count_parity(aws=resources["aws"], spark=resources["spark"], sync=resources["sync"])
    # The first two differing keys by key order are followed and named; the third is counted, and fails the check.
    assert not check.passed and check.metadata["untracked_differing_keys"].value == 1
    assert check.metadata["unexplained_examples"].value == "book-01 (missing from Iceberg), book-03 (differs in value)"
    assert "parity_max_tracked_keys" in check.description


def test_the_scan_streams_its_pages_to_the_spool_without_keeping_a_key_per_item(tmp_path):
    items = 60_000
    spool = tmp_path / "dynamodb.jsonl"
    tracemalloc.start()
    try:
        with spool.open("w", encoding="utf-8") as lines:
            scan = paced_item_digests(GeneratedScan(items), "books", partial(item_key, BOOKS.spec), 1e9, partial(write_pairs, lines, BOOKS.spec), segments=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert scan.items == items and sum(1 for _ in spool.open()) == items
    # A page of 1,000 ~1 KB items at a time (~3 MB with the page's Python objects); a dict of every key and digest
    # would be about 200 bytes a key more (12 MB here).
    assert peak < 6 * 2**20, peak


class DescribedTable:
    """DescribeTable of a table of `table_bytes`, provisioned with `read_capacity` units (0: on demand); records scans."""

    def __init__(self, table_bytes: int, read_capacity: int = 0):
        self.table_bytes, self.read_capacity, self.scans = table_bytes, read_capacity, 0

    def describe_table(self, TableName):
        throughput = {"ReadCapacityUnits": self.read_capacity}
        return {"Table": {"TableSizeBytes": self.table_bytes, "ItemCount": self.table_bytes // 1000, "ProvisionedThroughput": throughput}}

    def get_paginator(self, operation):
        self.scans += 1
        raise AssertionError("a scan refused by its estimate must not start")


class Clients:
    def __init__(self, dynamodb):
        self.dynamodb = dynamodb

    def client(self, service):
        return self.dynamodb


def test_a_scan_is_estimated_from_the_table_size_and_its_pace():
    # 10 GB of items, eventually consistent: 0.5 read unit a 4 KB, 1.22 million units.
    on_demand = scan_plan(DescribedTable(TEN_GB), "books", 0.1, 1000)
    assert on_demand.estimated_seconds == pytest.approx(TEN_GB / 8192 / 1000) and on_demand.estimated_seconds < 1300  # about 20 minutes
    provisioned = scan_plan(DescribedTable(TEN_GB, read_capacity=100), "books", 0.1, 1000)
    assert provisioned.read_units_per_second == 10 and provisioned.estimated_seconds > 33 * 3600


@pytest.mark.parametrize(
    ("read_capacity", "options", "setting"),
    [
        (100, {}, "DDB_ATHENA_PARITY_SCAN_CAPACITY_SHARE"),  # 10 units a second of a provisioned 100: 34 hours
        (0, {"parity_scan_read_units_per_second": 10}, "DDB_ATHENA_PARITY_SCAN_READ_UNITS_PER_SECOND"),  # on demand, slow
    ],
)
def test_a_scan_that_would_outlast_the_bound_is_refused_before_it_reads_naming_the_setting_to_raise(read_capacity, options, setting):
    dynamodb = DescribedTable(TEN_GB, read_capacity)
    result = key_parity_check(Clients(dynamodb), None, SyncSettings(bucket="bucket", **options), BOOKS)
    assert not result.passed and dynamodb.scans == 0
    assert setting in result.description and "DDB_ATHENA_PARITY_SCAN_MAX_HOURS (20)" in result.description
    assert result.metadata["dynamodb_scan_estimated_seconds"].value > 20 * 3600
