"""Orders assets: the daily DynamoDB export (orders_export) and its insert-only load into Iceberg (orders_athena)."""

import time
from contextlib import nullcontext
from datetime import datetime, timedelta

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from ddb_athena.exported.export import (
    COVERED,
    FULL_EXPORT,
    ExportError,
    ExportRecord,
    FullExportCoverage,
    export_partition,
    load_record,
    utc_now,
)
from ddb_athena.exported.load_runner import OrdersLoadRunner
from ddb_athena.exported.partition_load import OrdersLoadRequest, OrdersUpkeep
from ddb_athena.lake.export_load import ExportDataFile, loaded_full_export, table_loaded
from ddb_athena.lib.declarations import DECLARATIONS_FILE, DeclarationError, declared, declared_tables
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases
from ddb_athena.lib.settings import Settings
from ddb_athena.lib.writer_lease import ORDERS_WRITER_POOL
from ddb_athena.lib.writer_pools import warn_unless_writers_queue
from ddb_athena.streamed.capture.commit_manifests import write_commit_manifest


def refuse_unwired_exported(tables) -> None:
    """The exported assets below serve one table, orders: another exported declaration is refused when the code
    location loads, naming it, rather than left without assets in silence."""
    others = [table.name for table in tables if table.kind == "exported" and table.name != "orders"]
    if others:
        raise DeclarationError(
            f"{DECLARATIONS_FILE.name}: table {others[0]}, field kind: only one exported table, orders, has assets so far; "
            f"declare {others[0]} streamed (kept in sync from its stream), or leave it out until exported tables are made by declaration"
        )


refuse_unwired_exported(declared_tables().values())

# Partitions are part of the definitions, so their start is read when the code location loads.
orders_partitions = DailyPartitionsDefinition(start_date=Settings.from_env().orders_start_date, timezone="UTC")


class OrdersExportConfig(Config):
    bootstrap: bool = Field(
        default=False,
        description="Take a full export for this partition even though library.orders is loaded (recovery, or a "
        "window older than the point-in-time recovery retention).",
    )


@asset(
    partitions_def=orders_partitions,
    group_name="orders",
    pool=ORDERS_WRITER_POOL,
    kinds={"dynamodb", "s3"},
    description="The day's DynamoDB export of orders in S3: a full export first (or on request), then one "
    "incremental export per day, [day, day + 1). Days that the loaded full export covers export nothing.",
)
def orders_export(
    context: AssetExecutionContext,
    config: OrdersExportConfig,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    leases: WriterLeases,
) -> MaterializeResult:
    started = time.monotonic()
    # Held until the run ends: whether the table is loaded decides the export, and the load that follows changes it.
    warn_unless_writers_queue(context, ORDERS_WRITER_POOL)
    lease = leases.hold(context, aws.client("s3"), sync.bucket, sync.orders_iceberg_table, progress=spark.tasks_in_progress)
    window = context.partition_time_window
    session, table = spark.spark_session, sync.orders_iceberg_table
    full = config.bootstrap or not table_loaded(session, table)
    if full:
        reason = "requested" if config.bootstrap else f"{table} has not been loaded yet"
        context.log.info(f"Full export ({reason}); later partitions use incremental exports")
    loaded = None if full else loaded_full_export(session, table)

    def log_and_progress(message: str) -> None:
        lease.progressed()  # each poll of an export in progress (bounded by the export's own timeout)
        context.log.info(message)

    record, reused = export_partition(
        aws.client("dynamodb"),
        aws.client("s3"),
        sync.orders_layout,
        sync.orders_table,
        context.partition_key,
        window.start,
        window.end,
        full=full,
        coverage=FullExportCoverage(*loaded) if loaded else None,
        timeout=timedelta(minutes=sync.export_timeout_minutes),
        poll_seconds=sync.export_poll_seconds,
        log=log_and_progress,
        now=utc_now(),
    )
    return MaterializeResult(
        metadata={
            "export_arn": record.export_arn,
            "export_type": record.export_type,
            "window_start": record.window_start,
            "window_end": record.window_end,
            "export_time": record.export_time,
            "item_count": record.item_count,
            "data_files": len(record.data_files),
            "bytes": record.data_bytes,
            "from_manifest": record.from_manifest,
            "reused_export": reused,
            "s3_prefix": MetadataValue.url(sync.orders_layout.uri(record.s3_prefix)),
            **_coverage_metadata(record),
            "duration_seconds": time.monotonic() - started,
        }
    )


def _coverage_metadata(record: ExportRecord) -> dict:
    """Which full export covers a day that needed no export of its own."""
    if record.export_type != COVERED:
        return {}
    return {"covered_by_export": f"{record.export_arn} (every order as of {record.export_time})"}


ORDERS_LOAD_CHECKS = [
    AssetCheckSpec(
        "orders_export_reconciles",
        asset="orders_athena",
        description="Items in the export == rows inserted + duplicates skipped (+ deletes ignored + quarantined).",
    ),
    AssetCheckSpec(
        "orders_no_mutated_documents",
        asset="orders_athena",
        description="No order in the export differs from the one already loaded (documents are immutable).",
    ),
    AssetCheckSpec("orders_quarantine_empty", asset="orders_athena", description="No line or file of the export was quarantined."),
]


@asset(
    deps=[orders_export],
    partitions_def=orders_partitions,
    group_name="orders",
    pool=ORDERS_WRITER_POOL,
    kinds={"spark", "iceberg"},
    check_specs=ORDERS_LOAD_CHECKS,
    description="library.orders: orders in Iceberg, partitioned by day of created_at, loaded with an insert-only MERGE INTO.",
)
def orders_athena(
    context: AssetExecutionContext,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    orders_load: OrdersLoadRunner,
    leases: WriterLeases,
):
    started = time.monotonic()
    warn_unless_writers_queue(context, ORDERS_WRITER_POOL)
    lease = leases.hold(context, aws.client("s3"), sync.bucket, sync.orders_iceberg_table, progress=spark.tasks_in_progress)
    s3, layout, partition = aws.client("s3"), sync.orders_layout, context.partition_key
    record = load_record(s3, layout, partition)
    if record is None or record.status != "COMPLETED":
        raise ExportError(f"partition {partition} has no completed export: materialize orders_export for it first")
    if record.export_type == COVERED:
        context.log.info(f"Nothing to load: the day is covered by full export {record.export_arn}, loaded into {sync.orders_iceberg_table}")
    else:
        where = {"in_process": "in this run", "spark_submit": "as a spark-submit job", "emr_serverless": "on EMR Serverless"}[orders_load.mode]
        context.log.info(f"Loading {len(record.data_files)} files of export {record.export_arn} into {sync.orders_iceberg_table} {where}")
    request = OrdersLoadRequest(
        target=sync.orders_iceberg_table,
        catalog=spark.catalog,
        files=[
            ExportDataFile(layout.uri(key, spark.source_scheme), items)
            for key, items in zip(record.data_files, record.data_file_items or [None] * len(record.data_files), strict=True)
        ],
        quarantine_uri=layout.uri(f"{layout.quarantine_prefix}{partition}/{context.run.run_id}", spark.source_scheme),
        exported_at=datetime.fromisoformat(record.export_time),
        upkeep=OrdersUpkeep(sync.snapshot_retention_of(declared("orders")).total_seconds() / 3600, sync.snapshot_retain_last, sync.orphan_file_age_days),
        now=utc_now(),
        full_export_arn=record.export_arn if record.export_type == FULL_EXPORT else None,
        writer_lease={"uri": layout.uri(lease.key, spark.source_scheme), "holder": lease.holder, "ttl_seconds": lease.ttl_seconds},
        writer_token=lease.token,
    )
    # A load that runs as a job of its own makes its progress there: its platform's timeout bounds it, not the lease's.
    with lease.progress_elsewhere() if orders_load.mode != "in_process" else nullcontext():
        outcome, job_metadata = orders_load.load(context, request, spark, aws, before_commit=lease.check)
    result = outcome.load
    manifest = (
        write_commit_manifest(s3, layout, context.run.run_id, record.all_files, sync.orders_iceberg_table, result.snapshot_id, files_prefix=record.s3_prefix)
        if record.all_files
        else None
    )
    maintenance = {f"maintenance_{name}": value for name, value in outcome.maintenance.items()}
    if result.mutated_documents:
        context.log.warning(f"{result.mutated_documents} orders changed after they were loaded, e.g. {result.mutated_keys_sample}")
    if result.records_quarantined or result.corrupt_files:
        context.log.warning(f"Quarantined: {result.quarantine_reasons}")
    if result.type_mismatches:
        context.log.warning(f"Loaded, with a typed column NULL where the attribute has another type: {result.type_mismatches}")
    if result.columns_added:
        context.log.info(f"Columns added to {sync.orders_iceberg_table} and filled from each row's item: {', '.join(result.columns_added)}")
    seconds = time.monotonic() - started
    expected = record.item_count if record.item_count is not None else result.items_read
    return MaterializeResult(
        metadata={
            "rows_inserted": result.rows_inserted,
            "duplicates_skipped": result.duplicates_skipped,
            "mutated_documents": result.mutated_documents,
            # The partitions the load touched: what orders_unique_order_id reads.
            **({"days_loaded_from": result.days_from, "days_loaded_to": result.days_to} if result.days_from else {}),
            "deletes_ignored": result.deletes_ignored,
            "records_quarantined": result.records_quarantined,
            "records_type_mismatched": sum(result.type_mismatches.values()),
            "columns_added": ", ".join(result.columns_added) or "none",
            "corrupt_files": len(result.corrupt_files),
            "items_read": result.items_read,
            "bytes_read": record.data_bytes,
            "items_per_second": result.items_read / seconds if seconds else 0.0,
            "duration_seconds": seconds,
            "snapshot_id": result.snapshot_id,
            "export_arn": record.export_arn,
            "commit_manifest": manifest,
            "load_ran": orders_load.mode,
            **job_metadata,
            **_coverage_metadata(record),
            **maintenance,
        },
        check_results=[
            AssetCheckResult(
                check_name="orders_export_reconciles",
                passed=expected == result.accounted_for,
                metadata={
                    "export_item_count": expected,
                    "rows_inserted": result.rows_inserted,
                    "duplicates_skipped": result.duplicates_skipped,
                    "deletes_ignored": result.deletes_ignored,
                    "records_quarantined": result.records_quarantined,
                    "unaccounted": expected - result.accounted_for,
                },
            ),
            AssetCheckResult(
                check_name="orders_no_mutated_documents",
                passed=not result.mutated_documents,
                severity=AssetCheckSeverity.WARN,
                metadata={"mutated_documents": result.mutated_documents, "sample_keys": ", ".join(result.mutated_keys_sample)},
            ),
            AssetCheckResult(
                check_name="orders_quarantine_empty",
                passed=not (result.records_quarantined or result.corrupt_files or result.type_mismatches),
                metadata={
                    "records_quarantined": result.records_quarantined,
                    "records_type_mismatched": sum(result.type_mismatches.values()),
                    "corrupt_files": ", ".join(result.corrupt_files),
                    "reasons": str({**result.quarantine_reasons, **result.type_mismatches}),
                    "quarantine": layout.uri(f"{layout.quarantine_prefix}{partition}/"),
                },
            ),
        ],
    )
