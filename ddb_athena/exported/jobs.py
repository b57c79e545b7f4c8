"""The orders job: one day's export from DynamoDB and its load into library.orders (both in ORDERS_WRITER_POOL)."""

from dagster import AssetSelection, define_asset_job

from ddb_athena.exported.assets import orders_athena, orders_export

orders_daily = define_asset_job(
    "orders_daily",
    selection=AssetSelection.assets(orders_export, orders_athena),
    description="Export one day of orders from DynamoDB and load it into library.orders.",
)
