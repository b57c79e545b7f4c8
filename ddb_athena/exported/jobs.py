"""An exported table's daily job: one day's export from DynamoDB and its load into Iceberg (<name>_daily, orders_daily)."""

from dagster import AssetSelection, define_asset_job

from ddb_athena.exported.assets import EXPORTED

DAILY_JOBS = {
    name: define_asset_job(
        f"{name}_daily",
        selection=AssetSelection.assets(assets.export, assets.athena),
        description=f"Export one day of {name} from DynamoDB and load it into <namespace>.{assets.table.iceberg_table}.",
    )
    for name, assets in EXPORTED.items()
}
