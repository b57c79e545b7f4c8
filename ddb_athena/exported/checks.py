"""Asset checks of library.orders besides those its load reports: freshness and unique order_id."""

import warnings
from datetime import date

from dagster import AssetCheckExecutionContext, AssetCheckResult, SupersessionWarning, asset_check, build_last_update_freshness_checks

from ddb_athena.exported.assets import orders_athena
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.resources import IcebergSparkResource, SyncSettings
from ddb_athena.lib.table_checks import unique_key_result

# The partition of the week whose check reads the whole table (Monday is 0): the other nights read the days loaded.
FULL_PASS_WEEKDAY = 6
ORDERS_FRESHNESS = declared("orders").freshness

with warnings.catch_warnings():  # see ddb_athena/streamed/checks.py
    warnings.simplefilter("ignore", category=SupersessionWarning)
    orders_freshness_checks = build_last_update_freshness_checks(assets=[orders_athena], lower_bound_delta=ORDERS_FRESHNESS)


@asset_check(
    asset=orders_athena,
    description="No order_id appears twice in library.orders: among the days the latest load touched (an immutable "
    "order never changes day), over the whole table when that load was a Sunday's partition.",
)
def orders_unique_order_id(context: AssetCheckExecutionContext, spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
    latest = context.instance.get_latest_materialization_event(orders_athena.key)
    loaded = latest.asset_materialization.metadata if latest and latest.asset_materialization else {}
    partition = latest.dagster_event.partition if latest and latest.dagster_event else None
    if partition and date.fromisoformat(partition).weekday() == FULL_PASS_WEEKDAY or "rows_inserted" not in loaded:
        return unique_key_result(spark.spark_session, sync.orders_iceberg_table, declared("orders").spec.key_names)
    if "days_loaded_from" not in loaded:
        return AssetCheckResult(passed=True, metadata={"rows": 0, "duplicate_rows": 0, "scope": "no documents loaded"})
    days = (declared("orders").spec.partition_column.name, loaded["days_loaded_from"].value, loaded["days_loaded_to"].value)
    return unique_key_result(spark.spark_session, sync.orders_iceberg_table, declared("orders").spec.key_names, days)
