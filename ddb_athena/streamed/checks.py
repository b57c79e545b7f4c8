"""Asset checks of the books pipeline: freshness, backlog, quarantine, unique ids, parity with DynamoDB.

The sync run evaluates backlog, quarantine and unique ids in its cycles (`check_results.cycle_check_results`): they read S3 and
the Iceberg table, never DynamoDB. Parity with DynamoDB scans the user's table, so it runs once a day (its own job
and schedule), paced to a share of the table's read capacity, its consumed read units in its metadata. Every check
can be run on its own from the UI. Freshness is evaluated by its sensor, so it turns red even when no sync runs."""

import warnings

from dagster import AssetCheckResult, SupersessionWarning, asset_check, build_last_update_freshness_checks

from ddb_athena.lake.maintenance import table_files
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings
from ddb_athena.lib.table_checks import unique_key_result
from ddb_athena.streamed.assets import books_iceberg
from ddb_athena.streamed.check_results import (
    backlog_result,
    capture_failures_result,
    files_compact_result,
    key_parity_result,
    observe_key_parity,
    quarantine_result,
)

BOOKS_FRESHNESS = declared("books").freshness

# Superseded in 1.13 by FreshnessPolicy, which is not an asset check; this one is, and its sensor
# evaluates it even when the pipeline has stalled and no run would.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", category=SupersessionWarning)
    books_freshness_checks = build_last_update_freshness_checks(assets=[books_iceberg.key], lower_bound_delta=BOOKS_FRESHNESS)


@asset_check(asset=books_iceberg.key, description="No change file waits to be merged longer than the backlog limit (2 minutes).")
def books_backlog(aws: AwsClientsResource, sync: SyncSettings) -> AssetCheckResult:
    return backlog_result(aws, sync)


@asset_check(asset=books_iceberg.key, description="Every quarantined change record and foreign file has been dealt with.")
def books_quarantine_empty(aws: AwsClientsResource, sync: SyncSettings) -> AssetCheckResult:
    return quarantine_result(aws, sync)


@asset_check(
    asset=books_iceberg.key,
    description="With the capture Lambda: no stream batch waits in its on-failure queue (each is a range of changes "
    "missing from the table until `ddb-athena replay-failures` captures it again).",
)
def books_capture_failures(aws: AwsClientsResource, sync: SyncSettings) -> AssetCheckResult:
    if not sync.capture_failure_queue_url:
        return AssetCheckResult(passed=True, metadata={"queue": "none: the sync run reads the stream itself"})
    return capture_failures_result(aws, sync)


@asset_check(asset=books_iceberg.key, description="No id appears twice in library.books.")
def books_unique_id(spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
    return unique_key_result(spark.spark_session, sync.books_iceberg_table, declared("books").spec.key_names)


@asset_check(
    asset=books_iceberg.key,
    description="library.books holds the same items as the DynamoDB table, keys and values; a key may differ while its "
    "change is in flight (up to parity_settle_seconds, 120 by default, after the scan), and warns if it differs longer. "
    "Scans the DynamoDB table once, paced to a share of its read capacity: daily by its schedule (books_key_parity).",
)
def books_row_count_parity(aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
    return key_parity_result(*observe_key_parity(aws, spark, sync))


@asset_check(
    asset=books_iceberg.key,
    description="Compaction keeps library.books in few files: an average data file of at least 1 MiB, or at most 50 files.",
)
def books_files_compact(spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
    return files_compact_result(table_files(spark.spark_session, sync.books_iceberg_table))
