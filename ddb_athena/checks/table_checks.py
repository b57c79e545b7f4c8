"""Check logic shared by the tables' asset checks."""

from dagster import AssetCheckResult
from pyspark.sql import SparkSession

from ddb_athena.identifiers import dotted_name, validate_identifier


def unique_key_result(spark: SparkSession, table: str, key: str) -> AssetCheckResult:
    """Passes when no value of `key` appears twice in `table`."""
    key = validate_identifier(key, "key column")
    row = spark.sql(f"SELECT count(*) AS total, count(DISTINCT {key}) AS distinct_keys FROM {dotted_name(table)}").collect()[0]
    return AssetCheckResult(
        passed=row["total"] == row["distinct_keys"],
        metadata={"rows": row["total"], "duplicate_rows": row["total"] - row["distinct_keys"]},
    )
