"""Asset checks of each streamed table: freshness, backlog, quarantine, unique keys, parity with DynamoDB, compact files.

The sync run evaluates backlog and quarantine in its cycles (`check_results.cycle_check_results`): they list S3, never
read a table. Parity with DynamoDB scans the user's table and unique keys read the whole Iceberg table, so they run once
a day (their own job and schedule), the scan paced to a share of the table's read capacity, its consumed read units
in its metadata. Every check
can be run on its own from the UI. Freshness is evaluated by its sensor, so it turns red even when no sync runs."""

from dataclasses import dataclass

from dagster import AssetCheckResult, AssetChecksDefinition, asset_check

from ddb_athena.lake.maintenance import table_files
from ddb_athena.lib.freshness import FreshnessBound, freshness_check
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings
from ddb_athena.lib.table_checks import unique_check_name, unique_key_result
from ddb_athena.streamed.assets import STREAMED, StreamedAssets
from ddb_athena.streamed.check_results import (
    backlog_result,
    capture_failures_result,
    files_compact_result,
    key_parity_check,
    quarantine_result,
)


@dataclass(frozen=True)
class StreamedChecks:
    freshness_bound: FreshnessBound
    freshness: AssetChecksDefinition
    backlog: AssetChecksDefinition
    quarantine_empty: AssetChecksDefinition
    capture_failures: AssetChecksDefinition
    unique_key: AssetChecksDefinition
    parity: AssetChecksDefinition
    files_compact: AssetChecksDefinition

    @property
    def all(self) -> list:
        return [self.freshness, self.backlog, self.quarantine_empty, self.capture_failures, self.unique_key, self.parity, self.files_compact]


def streamed_checks(assets: StreamedAssets) -> StreamedChecks:
    table, asset = assets.table, assets.iceberg.key
    freshness_bound = FreshnessBound(asset, table.freshness)

    @asset_check(name=f"{table.name}_backlog", asset=asset, description="No change file waits to be merged longer than the backlog limit (2 minutes).")
    def backlog(aws: AwsClientsResource, sync: SyncSettings) -> AssetCheckResult:
        return backlog_result(aws, sync, table)

    @asset_check(name=f"{table.name}_quarantine_empty", asset=asset, description="Every quarantined change record and foreign file has been dealt with.")
    def quarantine_empty(aws: AwsClientsResource, sync: SyncSettings) -> AssetCheckResult:
        return quarantine_result(aws, sync, table)

    @asset_check(
        name=f"{table.name}_capture_failures",
        asset=asset,
        description="With the capture Lambda: no stream batch waits in its on-failure queue (each is a range of changes "
        "missing from the table until `ddb-athena replay-failures` captures it again).",
    )
    def capture_failures(aws: AwsClientsResource, sync: SyncSettings) -> AssetCheckResult:
        return capture_failures_result(aws, sync, table)

    @asset_check(name=unique_check_name(table), asset=asset, description=f"No key ({', '.join(table.spec.key_names)}) appears twice in the table.")
    def unique_key(spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
        return unique_key_result(spark.spark_session, sync.iceberg_table_of(table), table.spec.key_names)

    @asset_check(
        name=f"{table.name}_row_count_parity",
        asset=asset,
        description="The Iceberg table holds the same items as the DynamoDB table, keys and values; a key may differ while "
        "its change is in flight (up to parity_settle_seconds, 120 by default, after the scan), and warns if it differs "
        "longer. Scans the DynamoDB table once, paced to a share of a provisioned table's read capacity (a fixed rate on "
        f"demand), and fails without scanning when the scan would outlast parity_scan_max_hours: daily by its schedule ({table.name}_key_parity).",
    )
    def parity(aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
        return key_parity_check(aws, spark, sync, table)

    @asset_check(
        name=f"{table.name}_files_compact",
        asset=asset,
        description="Compaction keeps the table in few files: an average data file of at least 1 MiB, or at most 50 files.",
    )
    def files_compact(spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
        return files_compact_result(table_files(spark.spark_session, sync.iceberg_table_of(table)))

    return StreamedChecks(freshness_bound, freshness_check(freshness_bound), backlog, quarantine_empty, capture_failures, unique_key, parity, files_compact)


CHECKS = {name: streamed_checks(assets) for name, assets in STREAMED.items()}
