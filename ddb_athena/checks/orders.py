"""Asset checks of library.orders besides those its load reports: freshness and unique order_id."""

import warnings
from datetime import timedelta

from dagster import AssetCheckResult, SupersessionWarning, asset_check, build_last_update_freshness_checks

from ddb_athena.assets.orders import orders_athena
from ddb_athena.checks.table_checks import unique_key_result
from ddb_athena.resources import IcebergSparkResource, SyncSettings
from ddb_athena.table_spec import ORDERS_SPEC

# A daily load plus two hours of slack for a slow export.
ORDERS_FRESHNESS = timedelta(hours=26)

with warnings.catch_warnings():  # see ddb_athena/checks/books.py
    warnings.simplefilter("ignore", category=SupersessionWarning)
    orders_freshness_checks = build_last_update_freshness_checks(assets=[orders_athena], lower_bound_delta=ORDERS_FRESHNESS)


@asset_check(asset=orders_athena, description="No order_id appears twice in library.orders.")
def orders_unique_order_id(spark: IcebergSparkResource, sync: SyncSettings) -> AssetCheckResult:
    return unique_key_result(spark.spark_session, sync.orders_iceberg_table, ORDERS_SPEC.key.name)
