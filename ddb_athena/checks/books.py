"""Asset checks of the books pipeline: freshness, backlog, quarantine, unique ids, parity with DynamoDB.

The sync run evaluates backlog, quarantine and unique ids in its cycles (`cycle_check_results`): they read S3 and
the Iceberg table, never DynamoDB. Parity with DynamoDB scans the user's table, so it runs once a day (its own job
and schedule), paced to a share of the table's read capacity, its consumed read units in its metadata. Every check
can be run on its own from the UI. Freshness is evaluated by its sensor, so it turns red even when no sync runs."""

import json
import warnings
from datetime import datetime, timedelta, timezone

from dagster import AssetCheckResult, AssetCheckSeverity, SupersessionWarning, asset_check, build_last_update_freshness_checks

from ddb_athena.assets.books import books_iceberg
from ddb_athena.capture.change_files import is_change_file, list_keys
from ddb_athena.capture.commit_manifests import committed_files
from ddb_athena.capture.failed_batches import failure_queue_depth
from ddb_athena.capture.quarantine import quarantined_reasons
from ddb_athena.checks.table_checks import unique_key_result
from ddb_athena.key_parity import KeyParity, KeyScan, ParityTracker, paced_keys, read_rate_for
from ddb_athena.resources import AwsClientsResource, IcebergSparkResource, SyncSettings
from ddb_athena.spark.change_merge import row_versions, tombstone_versions
from ddb_athena.spark.maintenance import TableFiles, table_files
from ddb_athena.table_spec import BOOKS_SPEC

BOOKS_FRESHNESS = timedelta(minutes=2)
# Compaction keeps the average data file at least this big, or the table in at most this many files.
MIN_AVERAGE_DATA_FILE_BYTES = 1024 * 1024
SMALL_TABLE_MAX_FILES = 50
# How often a parity check run on its own looks again while keys are in flight.
PARITY_POLL_SECONDS = 5.0

# Superseded in 1.13 by FreshnessPolicy, which is not an asset check; this one is, and its sensor
# evaluates it even when the pipeline has stalled and no run would.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", category=SupersessionWarning)
    books_freshness_checks = build_last_update_freshness_checks(assets=[books_iceberg.key], lower_bound_delta=BOOKS_FRESHNESS)


def backlog_result(aws: AwsClientsResource, sync: SyncSettings, stream_lag_seconds: float | None = None) -> AssetCheckResult:
    """Change files waiting to be merged, and (from a sync cycle) how far behind the stream its capture is: the age of
    the newest change it captured, when it stopped with records left to read."""
    s3 = aws.client("s3")
    layout = sync.books_layout
    done = committed_files(s3, layout)
    pending = [obj for obj in list_keys(s3, layout.bucket, layout.changes_prefix) if is_change_file(obj["Key"]) and obj["Key"] not in done]
    ages = [datetime.now(timezone.utc) - obj["LastModified"] for obj in pending]
    oldest = max(ages, default=timedelta(0))
    behind = timedelta(seconds=stream_lag_seconds or 0)
    metadata = {"unmerged_files": len(pending), "oldest_unmerged_seconds": oldest.total_seconds()}
    if stream_lag_seconds is not None:
        metadata["stream_behind_seconds"] = stream_lag_seconds
    return AssetCheckResult(passed=oldest <= sync.backlog_limit and behind <= sync.backlog_limit, metadata=metadata)


def quarantine_result(aws: AwsClientsResource, sync: SyncSettings) -> AssetCheckResult:
    layout = sync.books_layout
    reasons = quarantined_reasons(aws.client("s3"), layout)
    return AssetCheckResult(
        passed=not reasons,
        metadata={
            "quarantined_records": sum(reasons.values()),
            "reasons": json.dumps(reasons),
            "quarantine": layout.uri(layout.quarantine_prefix),
        },
        description=None if not reasons else "Inspect the quarantined records, fix or re-inject them, then delete them.",
    )


def capture_failures_result(aws: AwsClientsResource, sync: SyncSettings) -> AssetCheckResult:
    depth = failure_queue_depth(aws.client("sqs"), sync.capture_failure_queue_url)
    return AssetCheckResult(
        passed=depth == 0,
        metadata={"failed_batches": depth, "queue": sync.capture_failure_queue_url},
        description=None if not depth else "The capture Lambda gave up on stream batches: their changes are missing from "
        "library.books. `ddb-athena replay-failures` captures them again while the stream holds them (24 hours).",
    )


def key_parity_result(parity: KeyParity, scans: list[KeyScan]) -> AssetCheckResult:
    return AssetCheckResult(
        passed=parity.passed,
        severity=AssetCheckSeverity.WARN,
        metadata={
            **parity.metadata(),
            "dynamodb_scans": len(scans),
            "dynamodb_read_units": sum(scan.read_units for scan in scans),
            "dynamodb_scan_seconds": sum(scan.seconds for scan in scans),
        },
        description=None if parity.passed else "Keys differ from DynamoDB for longer than a change takes to merge: a lost change or a "
        "hand-made edit of the table. A bootstrap run (config bootstrap: true) rebuilds the table from DynamoDB.",
    )


def key_parity_readers(aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings, scans: list[KeyScan]) -> tuple:
    """What a ParityTracker reads: library.books's keys and row versions, DynamoDB's keys (a paced scan, appended to
    `scans`), the newest tombstones of some keys."""
    key = BOOKS_SPEC.key
    dynamodb = aws.client("dynamodb")
    rate = read_rate_for(dynamodb, sync.books_table, sync.parity_scan_capacity_share, sync.parity_scan_read_units_per_second)

    def dynamodb_keys() -> list[str]:
        scans.append(paced_keys(dynamodb, sync.books_table, key.attribute, key.type_tag, rate, sync.parity_scan_segments))
        return scans[-1].keys

    return (
        lambda: row_versions(spark.spark_session, sync.books_iceberg_table, key.name),
        dynamodb_keys,
        lambda keys: tombstone_versions(spark.spark_session, sync.books_iceberg_table, key.name, keys),
    )


def observe_key_parity(aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings) -> tuple[KeyParity, list[KeyScan]]:
    """Compares the keys of library.books and DynamoDB until what was in flight at the first look has settled; each
    look is a paced scan of DynamoDB's keys (returned too, for what they read)."""
    scans: list[KeyScan] = []
    parity = ParityTracker(sync.parity_settle_seconds).observe_until_settled(
        *key_parity_readers(aws, spark, sync, scans), poll_seconds=min(PARITY_POLL_SECONDS, sync.parity_settle_seconds)
    )
    return parity, scans


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
    return unique_key_result(spark.spark_session, sync.books_iceberg_table, BOOKS_SPEC.key.name)


@asset_check(
    asset=books_iceberg.key,
    description="library.books holds the same keys as the DynamoDB table; a key may differ while its change is in flight "
    "(up to parity_settle_seconds, 60 by default), and warns if it differs longer. Scans the DynamoDB table's keys, paced "
    "to a share of its read capacity: daily by its schedule (books_key_parity).",
)
def books_row_count_parity(aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
    return key_parity_result(*observe_key_parity(aws, spark, sync))


def files_compact_result(files: TableFiles) -> AssetCheckResult:
    floor = min(MIN_AVERAGE_DATA_FILE_BYTES, files.data_bytes / SMALL_TABLE_MAX_FILES)
    return AssetCheckResult(
        passed=files.average_data_file_bytes >= floor,
        metadata={
            "data_files": files.data_files,
            "delete_files": files.delete_files,
            "average_data_file_bytes": files.average_data_file_bytes,
            "floor_bytes": floor,
            "metadata_files": files.metadata_files,
            "snapshots": files.snapshots,
        },
    )


@asset_check(
    asset=books_iceberg.key,
    description="Compaction keeps library.books in few files: an average data file of at least 1 MiB, or at most 50 files.",
)
def books_files_compact(spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
    return files_compact_result(table_files(spark.spark_session, sync.books_iceberg_table))


def cycle_check_results(
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    with_table: bool,
    stream_lag_seconds: float | None = None,
    list_s3: bool = True,
    quarantined: bool = False,
) -> dict[str, AssetCheckResult]:
    """The checks a sync cycle evaluates, by check name. Those that list S3 (backlog, quarantine) when `list_s3`, the
    backlog also whenever the capture stopped behind the stream (`stream_lag_seconds`, None when it caught up) and the
    quarantine whenever the cycle `quarantined` something; the one reading the table (a Spark job) when `with_table`.
    None reads DynamoDB's items."""
    results = {}
    if list_s3 or stream_lag_seconds is not None:
        results["books_backlog"] = backlog_result(aws, sync, stream_lag_seconds)
    if list_s3 or quarantined:
        results["books_quarantine_empty"] = quarantine_result(aws, sync)
    if sync.capture_failure_queue_url:
        results["books_capture_failures"] = capture_failures_result(aws, sync)
    if with_table:
        unique = unique_key_result(spark.spark_session, sync.books_iceberg_table, BOOKS_SPEC.key.name)
        # Between the daily key parity scans, a free signal beside the table's row count: DynamoDB's own item count
        # (DescribeTable, no read units; AWS refreshes it about every six hours, so it lags the table).
        item_count = aws.client("dynamodb").describe_table(TableName=sync.books_table)["Table"].get("ItemCount", 0)
        results["books_unique_id"] = AssetCheckResult(passed=unique.passed, metadata={**unique.metadata, "dynamodb_item_count_6h": item_count})
    return results
