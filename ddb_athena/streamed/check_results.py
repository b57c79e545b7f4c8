"""What the books checks find, as AssetCheckResults (no check definitions): the sync run evaluates some of them in
its cycles (`cycle_check_results`), and `checks.py` defines each as an asset check that can run on its own."""

import json
from datetime import UTC, datetime, timedelta
from functools import partial

from dagster import AssetCheckResult, AssetCheckSeverity

from ddb_athena.lake.change_merge import tombstone_versions
from ddb_athena.lake.maintenance import TableFiles
from ddb_athena.lake.table_keys import item_key
from ddb_athena.lake.table_spec import tombstone_table
from ddb_athena.lib.declarations import TableDeclaration
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, setting_variable
from ddb_athena.streamed.capture.change_files import is_change_file, list_keys
from ddb_athena.streamed.capture.commit_manifests import committed_files
from ddb_athena.streamed.capture.failed_batches import keep_failed_batches, kept_batch_keys
from ddb_athena.streamed.capture.quarantine import quarantined_reasons
from ddb_athena.streamed.key_parity import KeyParity, KeyScan, ParityReaders, ParityTracker, ScanPlan, paced_item_digests, scan_plan
from ddb_athena.streamed.parity_look import iceberg_rows, refreshed, whole_look

# Compaction keeps the average data file at least this big, or the table in at most this many files.
MIN_AVERAGE_DATA_FILE_BYTES = 1024 * 1024
SMALL_TABLE_MAX_FILES = 50
# How often a parity check looks at the table again while keys that differed await their verdict.
PARITY_POLL_SECONDS = 5.0


def backlog_result(aws: AwsClientsResource, sync: SyncSettings, table: TableDeclaration, stream_lag_seconds: float | None = None) -> AssetCheckResult:
    """Change files waiting to be merged, and (from a sync cycle) how far behind the stream its capture is: the age of
    the newest change it captured, when it stopped with records left to read."""
    s3 = aws.client("s3")
    layout = sync.layout_of(table)
    done = committed_files(s3, layout)
    pending = [obj for obj in list_keys(s3, layout.bucket, layout.changes_prefix) if is_change_file(obj["Key"]) and obj["Key"] not in done]
    ages = [datetime.now(UTC) - obj["LastModified"] for obj in pending]
    oldest = max(ages, default=timedelta(0))
    behind = timedelta(seconds=stream_lag_seconds or 0)
    metadata = {"unmerged_files": len(pending), "oldest_unmerged_seconds": oldest.total_seconds()}
    if stream_lag_seconds is not None:
        metadata["stream_behind_seconds"] = stream_lag_seconds
    limit = sync.backlog_limit_of(table)
    return AssetCheckResult(passed=oldest <= limit and behind <= limit, metadata=metadata)


def quarantine_result(aws: AwsClientsResource, sync: SyncSettings, table: TableDeclaration) -> AssetCheckResult:
    layout = sync.layout_of(table)
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


def capture_failures_result(aws: AwsClientsResource, sync: SyncSettings, table: TableDeclaration) -> AssetCheckResult:
    """Whether the capture Lambda gave up on a batch of `table`'s stream (its own queue: another table's failures
    leave this check green). The queue's messages are moved to S3 first, where they outlive the queue's 14 days."""
    queue = sync.capture_failure_queue_urls.get(table.name)
    if not queue and sync.capture_of(table) == "run":
        return AssetCheckResult(passed=True, metadata={"queue": "none: the sync run reads the stream itself"})
    if not queue:
        # The Lambda captures, and batches it gives up on go to a queue this check cannot see: it cannot say none did.
        return AssetCheckResult(
            passed=False,
            metadata={"queue": "unknown"},
            description=f"The capture Lambda reads the {table.name} stream, but no failure queue is set for it "
            "(DDB_ATHENA_CAPTURE_FAILURE_QUEUE_URLS, from the data stack's settings): batches it gave up on would go unseen.",
        )
    s3, layout = aws.client("s3"), sync.layout_of(table)
    keep_failed_batches(aws.client("sqs"), s3, queue, lambda stream_arn: layout)
    kept = len(kept_batch_keys(s3, layout))
    return AssetCheckResult(
        passed=kept == 0,
        metadata={"failed_batches": kept, "queue": queue, "kept_in": layout.uri(layout.failures_prefix)},
        description=None
        if not kept
        else f"The capture Lambda gave up on batches of the {table.name} stream: their changes are missing from the "
        "table. `ddb-athena replay-failures` captures them again while the stream holds them (24 hours); a bootstrap "
        "covers those it no longer holds.",
    )


def key_parity_result(parity: KeyParity, scans: list[KeyScan], plan: ScanPlan) -> AssetCheckResult:
    untracked = (
        f" {parity.untracked_keys} more keys differed than the check tracks (parity_max_tracked_keys): they were not settled." if parity.untracked_keys else ""
    )
    unholdable = sum(scan.unholdable_keys for scan in scans)
    not_compared = (
        f"DynamoDB items whose key the table's key columns cannot hold exactly: {unholdable}, not compared (the sync "
        "quarantines their changes; the quarantine check names the attribute)."
        if unholdable
        else ""
    )
    differ = (
        "Keys or values differ from DynamoDB for longer than a change takes to merge: a lost change or a hand-made edit of the "
        "table. A bootstrap run (config bootstrap: true) rebuilds the table from DynamoDB." + untracked
    )
    return AssetCheckResult(
        passed=parity.passed,
        severity=AssetCheckSeverity.WARN,
        metadata={
            **parity.metadata(),
            **_scan_plan_metadata(plan),
            "dynamodb_scans": len(scans),
            "dynamodb_read_units": sum(scan.read_units for scan in scans),
            "dynamodb_scan_seconds": sum(scan.seconds for scan in scans),
            "dynamodb_items_with_unholdable_keys": unholdable,
        },
        description=" ".join(text for text in ("" if parity.passed else differ, not_compared) if text) or None,
    )


def _scan_plan_metadata(plan: ScanPlan) -> dict:
    return {
        "dynamodb_read_units_per_second": plan.read_units_per_second,
        "dynamodb_table_bytes_6h": plan.table_bytes,
        "dynamodb_scan_estimated_seconds": plan.estimated_seconds,
    }


def scan_too_long(plan: ScanPlan, sync: SyncSettings) -> str | None:
    """Why a scan at `plan`'s pace would outlast the bound (the day between two checks, less a margin), naming the
    setting to raise; None when it would not. Refused rather than sped up past what the operator allowed."""
    bound_hours = sync.parity_scan_max_hours
    if plan.estimated_seconds <= bound_hours * 3600:
        return None
    paced_by_share = plan.provisioned and plan.read_units_per_second < sync.parity_scan_read_units_per_second
    remedy = (
        f"raise {setting_variable('parity_scan_capacity_share')} ({sync.parity_scan_capacity_share:g} of the table's read capacity) or the "
        "table's read capacity"
        if paced_by_share
        else f"raise {setting_variable('parity_scan_read_units_per_second')} ({sync.parity_scan_read_units_per_second:g}; on an on-demand "
        "table a scan costs the same read units at any pace)"
    )
    return (
        f"Not scanned: the DynamoDB table's {plan.table_bytes / 1e9:.1f} GB at {plan.read_units_per_second:g} read units a second would take "
        f"about {plan.estimated_seconds / 3600:.1f} hours, more than {setting_variable('parity_scan_max_hours')} ({bound_hours:g}): the scan "
        f"would overlap the next day's. To check this table, {remedy}."
    )


def key_parity_readers(
    aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings, table: TableDeclaration, scans: list[KeyScan], plan: ScanPlan | None = None
) -> ParityReaders:
    """What a ParityTracker reads: a whole look, compared by Spark (parity_look.py; its DynamoDB side a paced scan,
    appended to `scans`), the table's rows of some keys, the newest tombstones of some keys."""
    spec, source, target = table.spec, sync.dynamodb_table_of(table), sync.iceberg_table_of(table)
    dynamodb = aws.client("dynamodb")
    rate = (plan or parity_scan_plan(aws, sync, table)).read_units_per_second

    def scan_into(sink) -> None:
        scans.append(paced_item_digests(dynamodb, source, partial(item_key, spec), rate, sink, sync.parity_scan_segments))

    return ParityReaders(
        look=lambda: whole_look(refreshed(spark.spark_session, target), spec, target, scan_into, sync.parity_max_tracked_keys),
        rows=lambda keys: iceberg_rows(refreshed(spark.spark_session, target), spec, target, keys),
        tombstones=lambda keys: tombstone_versions(refreshed(spark.spark_session, tombstone_table(target)), spec, target, keys),
    )


def parity_scan_plan(aws: AwsClientsResource, sync: SyncSettings, table: TableDeclaration) -> ScanPlan:
    return scan_plan(aws.client("dynamodb"), sync.dynamodb_table_of(table), sync.parity_scan_capacity_share, sync.parity_scan_read_units_per_second)


def observe_key_parity(
    aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings, table: TableDeclaration, plan: ScanPlan | None = None
) -> tuple[KeyParity, list[KeyScan]]:
    """Compares a streamed table in Iceberg with DynamoDB, keys and values, until what differed has settled
    (key_parity.py).

    What it reads: the Iceberg table's key, sequence number and item columns once (the items are digested by the
    executors, and compared there); then DynamoDB's whole table once, a paced, eventually consistent scan (returned
    too, for what it read); then, every few seconds for at most the settle time after the scan, only the rows and
    tombstones of the keys that differed. It never reads DynamoDB a second time, so its read units are one scan's
    whatever differs."""
    scans: list[KeyScan] = []
    settle = sync.parity_settle_seconds_of(table)
    parity = ParityTracker(settle).observe_until_settled(
        key_parity_readers(aws, spark, sync, table, scans, plan), poll_seconds=min(PARITY_POLL_SECONDS, settle)
    )
    return parity, scans


def key_parity_check(aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings, table: TableDeclaration) -> AssetCheckResult:
    """The parity check's result; refused before any read when its scan would outlast the bound (`scan_too_long`)."""
    plan = parity_scan_plan(aws, sync, table)
    refused = scan_too_long(plan, sync)
    if refused:
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN, metadata=_scan_plan_metadata(plan), description=refused)
    return key_parity_result(*observe_key_parity(aws, spark, sync, table, plan), plan)


def files_compact_result(files: TableFiles) -> AssetCheckResult:
    floor = min(MIN_AVERAGE_DATA_FILE_BYTES, files.files_bytes / SMALL_TABLE_MAX_FILES)
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


def cycle_check_results(
    aws: AwsClientsResource,
    sync: SyncSettings,
    table: TableDeclaration,
    stream_lag_seconds: float | None = None,
    list_s3: bool = True,
    quarantined: bool = False,
) -> dict[str, AssetCheckResult]:
    """The checks a sync cycle evaluates, by check name: those that list S3 (backlog, quarantine) when `list_s3`, the
    backlog also whenever the capture stopped behind the stream (`stream_lag_seconds`, None when it caught up) and the
    quarantine whenever the cycle `quarantined` something. None reads the table (no Spark job holds the next cycle
    back: the whole-table checks are the daily run's, `jobs.py`) or DynamoDB's items."""
    results = {}
    if list_s3 or stream_lag_seconds is not None:
        results[f"{table.name}_backlog"] = backlog_result(aws, sync, table, stream_lag_seconds)
    if list_s3 or quarantined:
        results[f"{table.name}_quarantine_empty"] = quarantine_result(aws, sync, table)
    if table.name in sync.capture_failure_queue_urls:
        results[f"{table.name}_capture_failures"] = capture_failures_result(aws, sync, table)
    return results
