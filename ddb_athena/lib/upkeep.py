"""Table upkeep with the sync resource's settings, shared by the books sync run, the books_maintenance job and the
orders load."""

from datetime import datetime, timedelta

from ddb_athena.lake.maintenance import MaintenanceResult, maintain_table, record_maintained
from ddb_athena.lake.writer_branch import WriterBranch
from ddb_athena.lib.resources import IcebergSparkResource, SyncSettings


def maintain(
    spark: IcebergSparkResource,
    sync: SyncSettings,
    table: str,
    with_tombstones: bool,
    now: datetime | None = None,
    remove_orphans: bool = True,
    writer: WriterBranch | None = None,
) -> MaintenanceResult:
    """Compaction, expiry, orphans unless told not to (and tombstones, for a table that has them, pruned on `writer`'s
    branch), recorded on the table."""
    result = maintain_table(
        spark.spark_session,
        spark.catalog,
        table,
        snapshot_retention=sync.snapshot_retention,
        retain_last=sync.snapshot_retain_last,
        orphan_age=sync.orphan_file_age,
        tombstone_retention=timedelta(days=sync.tombstone_retention_days) if with_tombstones else None,
        remove_orphans=remove_orphans,
        writer=writer,
    )
    record_maintained(spark.spark_session, table, result, now)
    return result
