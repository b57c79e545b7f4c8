"""Exported tables' assets, for every exported table declared in ddb_athena/tables.toml: the day's DynamoDB export
(<name>_export, orders_export) and its insert-only load into Iceberg (<name>_athena, orders_athena)."""

import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
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
from ddb_athena.exported.load_runner import ExportLoadRunner
from ddb_athena.exported.partition_load import ExportLoadRequest, ExportUpkeep
from ddb_athena.lake.export_load import ExportDataFile, loaded_full_export, table_loaded
from ddb_athena.lib.declarations import TableDeclaration, declared_tables
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases
from ddb_athena.lib.settings import Settings
from ddb_athena.lib.writer_pools import warn_unless_writers_queue
from ddb_athena.streamed.capture.commit_manifests import write_commit_manifest

LOAD_PLACES = {"in_process": "in this run", "spark_submit": "as a spark-submit job", "emr_serverless": "on EMR Serverless"}


class ExportConfig(Config):
    bootstrap: bool = Field(
        default=False,
        description="Take a full export for this partition even though the Iceberg table is loaded (recovery, or a "
        "window older than the point-in-time recovery retention).",
    )


@dataclass(frozen=True)
class ExportedAssets:
    """The two assets of an exported table, daily partitioned from the deployment's start date."""

    table: TableDeclaration
    partitions: DailyPartitionsDefinition
    export: AssetsDefinition
    athena: AssetsDefinition


def load_check_names(table: TableDeclaration) -> tuple[str, str, str]:
    """The checks a load reports (orders_export_reconciles, orders_no_mutated_documents, orders_quarantine_empty)."""
    return f"{table.source_asset}_reconciles", f"{table.name}_no_mutated_documents", f"{table.name}_quarantine_empty"


def exported_assets(table: TableDeclaration, start_date: str) -> ExportedAssets:
    """The export and load assets of one exported table. Both are in its writers' pool: the load changes what decides
    the export (whether the table is loaded), and a backfill's partitions run one after the other."""
    name, pool = table.name, table.writer_pool
    partitions = DailyPartitionsDefinition(start_date=start_date, timezone="UTC")

    @asset(
        name=table.source_asset,
        partitions_def=partitions,
        group_name=name,
        pool=pool,
        kinds={"dynamodb", "s3"},
        description=f"The day's DynamoDB export of the {name} table in S3: a full export first (or on request), then one "
        "incremental export per day, [day, day + 1). Days that the loaded full export covers export nothing.",
    )
    def export(
        context: AssetExecutionContext, config: ExportConfig, aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings, leases: WriterLeases
    ) -> MaterializeResult:
        return export_day(context, config, aws, spark, sync, leases, table)

    reconciles, no_mutated_documents, quarantine_empty = load_check_names(table)
    load_checks = [
        AssetCheckSpec(
            reconciles,
            asset=table.table_asset,
            description="Items in the export == rows inserted + duplicates skipped (+ deletes ignored + quarantined).",
        ),
        AssetCheckSpec(
            no_mutated_documents,
            asset=table.table_asset,
            description=f"No {name} item in the export differs from the one already loaded (documents are immutable).",
        ),
        AssetCheckSpec(quarantine_empty, asset=table.table_asset, description="No line or file of the export was quarantined."),
    ]
    partition_by = ", ".join(table.spec.partition_by)

    @asset(
        name=table.table_asset,
        deps=[export],
        partitions_def=partitions,
        group_name=name,
        pool=pool,
        kinds={"spark", "iceberg"},
        check_specs=load_checks,
        description=f"<namespace>.{table.iceberg_table}: the {name} table in Iceberg, partitioned by {partition_by}, loaded with an insert-only MERGE INTO.",
    )
    def athena(
        context: AssetExecutionContext,
        aws: AwsClientsResource,
        spark: IcebergSparkResource,
        sync: SyncSettings,
        orders_load: ExportLoadRunner,  # the resource's key since orders was the only exported table
        leases: WriterLeases,
    ) -> MaterializeResult:
        return load_day(context, aws, spark, sync, orders_load, leases, table)

    return ExportedAssets(table, partitions, export, athena)


def export_day(
    context: AssetExecutionContext,
    config: ExportConfig,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    leases: WriterLeases,
    declaration: TableDeclaration,
) -> MaterializeResult:
    started = time.monotonic()
    # Held until the run ends: whether the table is loaded decides the export, and the load that follows changes it.
    warn_unless_writers_queue(context, declaration.writer_pool)
    session, table, layout = spark.spark_session, sync.iceberg_table_of(declaration), sync.layout_of(declaration)
    lease = leases.hold(context, aws.client("s3"), sync.bucket, table, progress=spark.tasks_in_progress)
    window = context.partition_time_window
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
        layout,
        sync.dynamodb_table_of(declaration),
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
            "s3_prefix": MetadataValue.url(layout.uri(record.s3_prefix)),
            **_coverage_metadata(record),
            "duration_seconds": time.monotonic() - started,
        }
    )


def _coverage_metadata(record: ExportRecord) -> dict:
    """Which full export covers a day that needed no export of its own."""
    if record.export_type != COVERED:
        return {}
    return {"covered_by_export": f"{record.export_arn} (every order as of {record.export_time})"}


def load_day(
    context: AssetExecutionContext,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    runner: ExportLoadRunner,
    leases: WriterLeases,
    declaration: TableDeclaration,
) -> MaterializeResult:
    started = time.monotonic()
    mode = runner.mode_of(declaration.name)
    warn_unless_writers_queue(context, declaration.writer_pool)
    table = sync.iceberg_table_of(declaration)
    lease = leases.hold(context, aws.client("s3"), sync.bucket, table, progress=spark.tasks_in_progress)
    s3, layout, partition = aws.client("s3"), sync.layout_of(declaration), context.partition_key
    record = load_record(s3, layout, partition)
    if record is None or record.status != "COMPLETED":
        raise ExportError(f"partition {partition} has no completed export: materialize {declaration.source_asset} for it first")
    if record.export_type == COVERED:
        context.log.info(f"Nothing to load: the day is covered by full export {record.export_arn}, loaded into {table}")
    else:
        context.log.info(f"Loading {len(record.data_files)} files of export {record.export_arn} into {table} {LOAD_PLACES[mode]}")
    request = ExportLoadRequest(
        table=declaration.name,
        target=table,
        catalog=spark.catalog,
        files=[
            ExportDataFile(layout.uri(key, spark.source_scheme), items)
            for key, items in zip(record.data_files, record.data_file_items or [None] * len(record.data_files), strict=True)
        ],
        quarantine_uri=layout.uri(f"{layout.quarantine_prefix}{partition}/{context.run.run_id}", spark.source_scheme),
        exported_at=datetime.fromisoformat(record.export_time),
        upkeep=ExportUpkeep(sync.snapshot_retention_of(declaration).total_seconds() / 3600, sync.snapshot_retain_last, sync.orphan_file_age_days),
        now=utc_now(),
        full_export_arn=record.export_arn if record.export_type == FULL_EXPORT else None,
        writer_lease={"uri": layout.uri(lease.key, spark.source_scheme), "holder": lease.holder, "ttl_seconds": lease.ttl_seconds},
        writer_token=lease.token,
        writer_epoch=lease.epoch,
    )
    # A load that runs as a job of its own makes its progress there: its platform's timeout bounds it, not the lease's.
    with lease.progress_elsewhere() if mode != "in_process" else nullcontext():
        outcome, job_metadata = runner.load(context, request, spark, aws, before_commit=lease.check)
    result = outcome.load
    manifest = (
        write_commit_manifest(s3, layout, context.run.run_id, record.all_files, table, result.snapshot_id, files_prefix=record.s3_prefix)
        if record.all_files
        else None
    )
    maintenance = {f"maintenance_{name}": value for name, value in outcome.maintenance.items()}
    if result.mutated_documents:
        context.log.warning(f"{result.mutated_documents} {declaration.name} items changed after they were loaded, e.g. {result.mutated_keys_sample}")
    if result.records_quarantined or result.corrupt_files:
        context.log.warning(f"Quarantined: {result.quarantine_reasons}")
    if result.type_mismatches:
        context.log.warning(f"Loaded, with a typed column NULL where the attribute has another type: {result.type_mismatches}")
    if result.columns_added:
        context.log.info(f"Columns added to {table} and filled from each row's item: {', '.join(result.columns_added)}")
    seconds = time.monotonic() - started
    reconciles, no_mutated_documents, quarantine_empty = load_check_names(declaration)
    expected = record.item_count if record.item_count is not None else result.items_read
    return MaterializeResult(
        metadata={
            "rows_inserted": result.rows_inserted,
            "duplicates_skipped": result.duplicates_skipped,
            "mutated_documents": result.mutated_documents,
            # The partitions the load touched: what the unique key check reads.
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
            "load_ran": mode,
            **job_metadata,
            **_coverage_metadata(record),
            **maintenance,
        },
        check_results=[
            AssetCheckResult(
                check_name=reconciles,
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
                check_name=no_mutated_documents,
                passed=not result.mutated_documents,
                severity=AssetCheckSeverity.WARN,
                metadata={"mutated_documents": result.mutated_documents, "sample_keys": ", ".join(result.mutated_keys_sample)},
            ),
            AssetCheckResult(
                check_name=quarantine_empty,
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


# Partitions are part of the definitions, so their start is read when the code location loads.
_SCHEDULES = Settings.from_env().exported
EXPORTED = {name: exported_assets(table, _SCHEDULES[name].start_date.isoformat()) for name, table in declared_tables().items() if table.kind == "exported"}
