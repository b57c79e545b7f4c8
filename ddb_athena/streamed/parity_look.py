"""The key parity check's reads of the table, and its whole look in Spark (key_parity.py): the table's keys, versions
and item digests joined with DynamoDB's keys and item digests by the executors; only the keys that differ come back to
the driver, at most a cap of them.

The table side is read first and kept on the executors' disk (DISK_ONLY, counted at once), so that the scan, however
long, is compared with the table as it was before the scan started. The DynamoDB side reaches Spark as JSON lines the
scan writes into a spool file a page at a time: the driver holds one page, never a key per item. The spool is on the
driver's disk, which the executors of the check's local Spark (the run worker's) share; 10 million keys take about
700 MB there, and as much again of the executors' disk for the table side.
"""

import base64
import json
import tempfile
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import IO

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ddb_athena.lake.identifiers import dotted_name
from ddb_athena.lake.table_keys import Key, key_rows_schema, row_key
from ddb_athena.lake.table_spec import ITEM_COLUMN, SEQUENCE_COLUMN, TableSpec
from ddb_athena.streamed.key_parity import DigestSink, Look, Row, item_json_digest

# Prefixed: a table's key columns may be named anything else.
ROW_VERSION, ROW_DIGEST, ITEM_DIGEST = "_parity_row_version", "_parity_row_digest", "_parity_item_digest"
IN_TABLE, IN_DYNAMODB = "_parity_in_table", "_parity_in_dynamodb"


def refreshed(spark: SparkSession, table: str) -> SparkSession:
    """`spark`, its catalog's copy of `table` dropped: the check runs apart from the sync, whose commits reach it only
    through the catalog, and Iceberg's CachingCatalog keeps a table for as long as it is read at least every 30 s (it
    expires entries after access), so looks a few seconds apart would all see the table the first one loaded."""
    spark.sql(f"REFRESH TABLE {dotted_name(table)}")
    return spark


def table_digests(spark: SparkSession, spec: TableSpec, target: str, keys: set[Key] | None = None) -> DataFrame:
    """The rows of `target` (all, or those of `keys`): the key columns, the sequence number of the change each was
    written from, and its item's digest, computed by the executors (items never leave them)."""
    rows = spark.table(dotted_name(target)).select(*spec.key_names, F.col(SEQUENCE_COLUMN).alias(ROW_VERSION), ITEM_COLUMN)
    if keys is not None:
        # Before the digests: a recheck digests its few keys' items, not the table's.
        rows = rows.join(F.broadcast(spark.createDataFrame(sorted(keys), key_rows_schema(spec))), spec.key_names)
    return rows.select(*spec.key_names, ROW_VERSION, F.udf(item_json_digest, "string")(ITEM_COLUMN).alias(ROW_DIGEST))


def iceberg_rows(spark: SparkSession, spec: TableSpec, target: str, keys: set[Key]) -> dict[Key, Row]:
    """The rows of some keys (a second look: the keys that differed, at most the tracked cap of them)."""
    if not keys:
        return {}
    return {row_key(spec, row): Row(row[ROW_VERSION], row[ROW_DIGEST]) for row in table_digests(spark, spec, target, keys).collect()}


def whole_look(spark: SparkSession, spec: TableSpec, target: str, scan_into: Callable[[DigestSink], object], max_tracked_keys: int) -> Look:
    """The table's rows, then DynamoDB's items (`scan_into` hands every page's keys and digests to the sink it is
    given), compared by Spark: the counts of both, and the first `max_tracked_keys` keys that differ (by key order)
    with what each side holds, the others counted."""
    if not spark.sparkContext.master.startswith("local"):
        raise ValueError("the key parity check spools DynamoDB's side on the driver's disk: it runs on a local Spark master")
    table = table_digests(spark, spec, target).withColumn(IN_TABLE, F.lit(True)).persist(StorageLevel.DISK_ONLY)
    try:
        iceberg_rows_read = table.count()
        with tempfile.TemporaryDirectory(prefix="ddb-athena-parity-") as directory:
            spool = Path(directory) / "dynamodb.jsonl"
            with spool.open("w", encoding="utf-8") as lines:
                scan_into(lambda pairs: write_pairs(lines, spec, pairs))
            joined = table.join(_spooled_items(spark, spec, spool), spec.key_names, "full_outer")
            differs = F.col(IN_TABLE).isNull() | F.col(IN_DYNAMODB).isNull() | ~F.col(ROW_DIGEST).eqNullSafe(F.col(ITEM_DIGEST))
            counts = joined.agg(F.count(IN_DYNAMODB).alias("items"), F.count(F.when(differs, True)).alias("differing")).first()
            named = joined.where(differs).orderBy(*spec.key_names).limit(max_tracked_keys).collect()
    finally:
        table.unpersist()
    differing = {
        row_key(spec, row): (Row(row[ROW_VERSION], row[ROW_DIGEST]) if row[IN_TABLE] else None, row[ITEM_DIGEST] if row[IN_DYNAMODB] else None) for row in named
    }
    return Look(iceberg_rows_read, counts["items"], differing, counts["differing"] - len(differing))


def _spool_value(tag: str, value: str | Decimal | bytes) -> str:
    """A key value as spool text: a number in plain notation (Spark casts it exactly), bytes in base64."""
    if tag == "N":
        return format(value, "f")
    if tag == "B":
        return base64.b64encode(value).decode("ascii")
    return value


def write_pairs(lines: IO[str], spec: TableSpec, pairs: list[tuple[Key, str]]) -> None:
    """A page's keys and digests as spool lines (nothing kept)."""
    tags = [(column.name, column.type_tag) for column in spec.key_columns]
    lines.writelines(
        json.dumps({**{name: _spool_value(tag, value) for (name, tag), value in zip(tags, key, strict=True)}, ITEM_DIGEST: digest}, ensure_ascii=False) + "\n"
        for key, digest in pairs
    )


def _spool_column(name: str, tag: str, sql_type: str) -> Column:
    if tag == "B":
        return F.unbase64(name).alias(name)
    return F.col(name).cast(sql_type).alias(name)


def _spooled_items(spark: SparkSession, spec: TableSpec, spool: Path) -> DataFrame:
    """DynamoDB's side: the spooled keys in their columns' types, the item digests, and a presence flag."""
    schema = ", ".join([*(f"{name} string" for name in spec.key_names), f"{ITEM_DIGEST} string"])
    items = spark.read.schema(schema).json(spool.as_uri())
    keys = [_spool_column(column.name, column.type_tag, column.sql_type) for column in spec.key_columns]
    return items.select(*keys, ITEM_DIGEST, F.lit(True).alias(IN_DYNAMODB))
