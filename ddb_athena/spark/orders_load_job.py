"""The orders load as a Spark job: `spark-submit orders_load_job.py`, on EMR Serverless or locally.

Dagster Pipes brings the request (the extra `orders_load`, see `OrdersLoadRequest`) and takes the outcome back as
the materialization's metadata (`orders_load`). The SparkSession is the one spark-submit configured.
"""

from dagster_pipes import open_dagster_pipes
from pyspark.sql import SparkSession

from ddb_athena.spark.orders_partition import OrdersLoadRequest, load_orders_partition

REQUEST_EXTRA = "orders_load"
OUTCOME_METADATA = "orders_load"


def main() -> None:
    with open_dagster_pipes() as pipes:
        request = OrdersLoadRequest.from_json(pipes.get_extra(REQUEST_EXTRA))
        pipes.log.info(f"Loading {len(request.files)} export files into {request.target}")
        spark = SparkSession.builder.getOrCreate()
        outcome = load_orders_partition(spark, request)
        pipes.log.info(f"Inserted {outcome.load.rows_inserted} rows; snapshot {outcome.load.snapshot_id}")
        pipes.report_asset_materialization(metadata={OUTCOME_METADATA: {"raw_value": outcome.to_json(), "type": "json"}})


if __name__ == "__main__":
    main()
