"""Asset checks of each exported table besides those its load reports: freshness and unique keys."""

from dataclasses import dataclass
from datetime import date

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetChecksDefinition, asset_check

from ddb_athena.exported.assets import EXPORTED, ExportedAssets
from ddb_athena.lib.freshness import FreshnessBound, freshness_check
from ddb_athena.lib.resources import IcebergSparkResource, SyncSettings
from ddb_athena.lib.table_checks import unique_check_name, unique_key_result

# The partition of the week whose check reads the whole table (Monday is 0): the other nights read the days loaded.
FULL_PASS_WEEKDAY = 6


@dataclass(frozen=True)
class ExportedChecks:
    freshness_bound: FreshnessBound
    freshness: AssetChecksDefinition
    unique_key: AssetChecksDefinition

    @property
    def all(self) -> list:
        return [self.freshness, self.unique_key]


def exported_checks(assets: ExportedAssets) -> ExportedChecks:
    table, asset = assets.table, assets.athena
    freshness_bound = FreshnessBound(asset.key, table.freshness)
    keys = table.spec.key_names

    @asset_check(
        name=unique_check_name(table),
        asset=asset,
        description=f"No key ({', '.join(keys)}) appears twice in the table: among the days the latest load touched (an "
        "immutable document never changes day), over the whole table when that load was a Sunday's partition.",
    )
    def unique_key(context: AssetCheckExecutionContext, spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
        latest = context.instance.get_latest_materialization_event(asset.key)
        loaded = latest.asset_materialization.metadata if latest and latest.asset_materialization else {}
        partition = latest.dagster_event.partition if latest and latest.dagster_event else None
        target = sync.iceberg_table_of(table)
        if partition and date.fromisoformat(partition).weekday() == FULL_PASS_WEEKDAY or "rows_inserted" not in loaded:
            return unique_key_result(spark.spark_session, target, keys)
        if "days_loaded_from" not in loaded:
            return AssetCheckResult(passed=True, metadata={"rows": 0, "duplicate_rows": 0, "scope": "no documents loaded"})
        days = (table.spec.partition_column.name, loaded["days_loaded_from"].value, loaded["days_loaded_to"].value)
        return unique_key_result(spark.spark_session, target, keys, days)

    return ExportedChecks(freshness_bound, freshness_check(freshness_bound), unique_key)


EXPORTED_CHECKS = {name: exported_checks(assets) for name, assets in EXPORTED.items()}
