"""Table upkeep with the sync resource's settings, shared by the sync run (compaction, tombstone pruning), the
`streamed_upkeep` runs (expiry and orphans, beside the sync), the `<table>_maintenance` job and the orders load."""

from datetime import datetime, timedelta

from ddb_athena.lake.maintenance import MaintenanceResult, maintain_table, record_maintained, trim_history
from ddb_athena.lake.writer_branch import WriterBranch
from ddb_athena.lib.declarations import TableDeclaration
from ddb_athena.lib.resources import IcebergSparkResource, SyncSettings


def maintain(
    spark: IcebergSparkResource,
    sync: SyncSettings,
    table: TableDeclaration,
    now: datetime | None = None,
    remove_orphans: bool = True,
    writer: WriterBranch | None = None,
) -> MaintenanceResult:
    """Compaction, expiry (at the table's declared retention, else the sync resource's), orphans unless told not to (and
    a streamed table's tombstones pruned on `writer`'s branch), recorded on the table."""
    target, with_tombstones = sync.iceberg_table_of(table), table.kind == "streamed"
    result = maintain_table(
        spark.spark_session,
        spark.catalog,
        target,
        **_retentions(sync, table),
        tombstone_retention=timedelta(days=sync.tombstone_retention_days) if with_tombstones else None,
        remove_orphans=remove_orphans,
        writer=writer,
    )
    record_maintained(spark.spark_session, target, result, now)
    return result


def trim(spark: IcebergSparkResource, sync: SyncSettings, table: TableDeclaration, now: datetime, remove_orphans: bool) -> MaintenanceResult:
    """Expiry and, if told, orphan removal of the table and its tombstones (no writer: lake/maintenance.trim_history),
    recorded on the table."""
    target = sync.iceberg_table_of(table)
    result = trim_history(
        spark.spark_session,
        spark.catalog,
        target,
        **_retentions(sync, table),
        with_tombstones=table.kind == "streamed",
        now=now,
        remove_orphans=remove_orphans,
    )
    record_maintained(spark.spark_session, target, result, now)
    return result


def _retentions(sync: SyncSettings, table: TableDeclaration) -> dict:
    """What expiry and the orphan sweep keep: the table's declared snapshot retention, else the sync resource's."""
    return {"snapshot_retention": sync.snapshot_retention_of(table), "retain_last": sync.snapshot_retain_last, "orphan_age": sync.orphan_file_age}
