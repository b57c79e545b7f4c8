"""Iceberg table maintenance with Spark procedures: compaction, snapshot expiry, tombstone pruning.

Snapshots are expired only once older than a retention that exceeds the longest query, so a
reader that planned its scan on an older snapshot can always read it to the end.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from pyspark.sql import SparkSession

from ddb_athena.identifiers import dotted_name, validate_identifier
from ddb_athena.spark.change_merge import tombstone_table
from ddb_athena.table_spec import timestamp_literal


@dataclass
class MaintenanceResult:
    rewritten_data_files: int
    added_data_files: int
    expired_snapshots: int
    deleted_data_files: int
    pruned_tombstones: int


def maintain_table(
    spark: SparkSession,
    catalog: str,
    target: str,
    snapshot_retention: timedelta,
    retain_last: int,
    tombstone_retention: timedelta,
    now: datetime | None = None,
) -> MaintenanceResult:
    now = now or datetime.now(timezone.utc)
    catalog = validate_identifier(catalog, "catalog name")
    table_sql = dotted_name(target)
    if retain_last < 1:
        raise ValueError("retain_last must be at least 1")
    # Small files from minute merges, and data files carrying delete files, are rewritten.
    rewrite = spark.sql(
        f"CALL {catalog}.system.rewrite_data_files(table => '{table_sql}', "
        "options => map('min-input-files', '2', 'delete-file-threshold', '1', 'remove-dangling-deletes', 'true'))"
    ).collect()[0]
    snapshots_before = spark.table(f"{table_sql}.snapshots").count()
    expire = spark.sql(
        f"CALL {catalog}.system.expire_snapshots(table => '{table_sql}', "
        f"older_than => {timestamp_literal(now - snapshot_retention)}, retain_last => {int(retain_last)})"
    ).collect()[0]
    tombstones_sql = dotted_name(tombstone_table(target))
    # A tombstone guards against replays of older changes; past the retention no such file may remain.
    before = spark.table(tombstones_sql).count()
    spark.sql(f"DELETE FROM {tombstones_sql} WHERE deleted_at < {timestamp_literal(now - tombstone_retention)}")
    pruned = before - spark.table(tombstones_sql).count()
    return MaintenanceResult(
        rewritten_data_files=rewrite["rewritten_data_files_count"],
        added_data_files=rewrite["added_data_files_count"],
        expired_snapshots=snapshots_before - spark.table(f"{table_sql}.snapshots").count(),
        deleted_data_files=expire["deleted_data_files_count"] + expire["deleted_position_delete_files_count"],
        pruned_tombstones=pruned,
    )
