"""Check logic shared by the tables' asset checks."""

from datetime import date, timedelta

from dagster import AssetCheckResult
from pyspark.sql import SparkSession

from ddb_athena.lake.identifiers import dotted_name, validate_identifier
from ddb_athena.lib.declarations import TableDeclaration


def unique_check_name(table: TableDeclaration) -> str:
    """`books_unique_id`, `reviews_unique_book_id_review_id`: the check that no key appears twice."""
    return f"{table.name}_unique_{'_'.join(table.spec.key_names)}"


def unique_key_result(spark: SparkSession, table: str, keys: list[str], days: tuple[str, str, str] | None = None) -> AssetCheckResult:
    """Passes when no key (the values of the `keys` columns together) appears twice in `table`, or with `days` (a
    timestamp column, the first and the last day, ISO), among the rows of those days: the partitions a load touched,
    not the whole table."""
    key = ", ".join(validate_identifier(name, "key column") for name in keys)
    where, args = "", {}
    if days is not None:
        column, first, last = validate_identifier(days[0], "day column"), date.fromisoformat(days[1]), date.fromisoformat(days[2])
        where = f" WHERE {column} >= CAST(:first AS TIMESTAMP) AND {column} < CAST(:after AS TIMESTAMP)"
        args = {"first": first.isoformat(), "after": (last + timedelta(days=1)).isoformat()}
    row = spark.sql(f"SELECT count(*) AS total, count(DISTINCT {key}) AS distinct_keys FROM {dotted_name(table)}{where}", args=args).collect()[0]
    scope = {"scope": f"days {days[1]} to {days[2]}" if days else "whole table"}
    return AssetCheckResult(
        passed=row["total"] == row["distinct_keys"],
        metadata={"rows": row["total"], "duplicate_rows": row["total"] - row["distinct_keys"], **scope},
    )
