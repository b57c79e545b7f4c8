"""Benchmark of the orders load: 1,000,000 orders in 8 gzipped full-export files, loaded into
library.orders by the real Spark load, beside the same transform in DuckDB over the same files.

Run with `make bench`. Prints figures; asserts nothing (targets live here, not in tests).
"""

import gzip
import multiprocessing
import random
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ORDERS = 1_000_000
FILES = 8
TARGET_ITEMS_PER_SECOND = 150_000
EXPORTED_AT = datetime(2026, 11, 22, tzinfo=UTC)


def _write_file(arguments: tuple[Path, int, int]) -> None:
    """One data file of the full-export layout; orders spread over 90 days (each a partition)."""
    path, first, count = arguments
    rng = random.Random(first)
    start = EXPORTED_AT - timedelta(days=90)
    lines = []
    for index in range(first, first + count):
        created = (start + timedelta(seconds=rng.randrange(90 * 86_400))).strftime("%Y-%m-%dT%H:%M:%SZ")
        items = ",".join(f'{{"M":{{"sku":{{"S":"sku-{rng.randrange(1000)}"}},"qty":{{"N":"{rng.randrange(1, 4)}"}}}}}}' for _ in range(rng.randrange(1, 4)))
        lines.append(
            f'{{"Item":{{"order_id":{{"S":"{uuid.UUID(int=rng.getrandbits(128))}"}},"customer_id":{{"S":"customer-{index % 10_000}"}},'
            f'"amount":{{"N":"{rng.randrange(100, 100_000) / 100:.2f}"}},"currency":{{"S":"{rng.choice(("EUR", "USD", "NOK"))}"}},'
            f'"created_at":{{"S":"{created}"}},"items":{{"L":[{items}]}},"paid":{{"BOOL":{"true" if rng.random() < 0.9 else "false"}}}}}}}\n'
        )
    with gzip.open(path, "wt", compresslevel=6) as out:
        out.writelines(lines)


def write_export_files(directory: Path) -> list[Path]:
    per_file = ORDERS // FILES
    paths = [directory / f"{uuid.uuid4().hex[:26]}.json.gz" for _ in range(FILES)]
    with multiprocessing.Pool(2) as pool:
        pool.map(_write_file, [(path, number * per_file, per_file) for number, path in enumerate(paths)])
    return paths


def spark_load(paths: list[Path], workdir: Path) -> tuple[float, float]:
    """(seconds in a fresh JVM, as a daily job pays them; seconds in a warm JVM, as on a long-lived cluster)."""
    from ddb_athena.lake.export_load import ExportDataFile, load_export_files
    from ddb_athena.lib.declarations import declared
    from ddb_athena.lib.resources import IcebergSparkResource

    started = time.monotonic()
    spark = IcebergSparkResource(profile="local", warehouse=(workdir / "warehouse").as_uri(), extra_config={"spark.ui.enabled": "false"}).spark_session
    spark.sparkContext.setLogLevel("ERROR")
    print(f"SparkSession start: {time.monotonic() - started:.1f} s")
    # As from AWS: the manifest's line count of each file comes with it.
    files = [ExportDataFile(path.as_uri(), ORDERS // FILES) for path in paths]
    quarantine = (workdir / "quarantine").as_uri()

    def load(table: str):
        started = time.monotonic()
        result = load_export_files(spark, declared("orders").spec, table, files, quarantine, EXPORTED_AT)
        return result, time.monotonic() - started

    result, cold = load("bench.orders")
    print(f"Spark load of {result.items_read:,} orders into an empty table, fresh JVM: {cold:.1f} s, {result.rows_inserted:,} inserted")
    again, seconds = load("bench.orders")
    print(
        f"Re-load of the same export (all duplicates, each compared with the stored document): {seconds:.1f} s, "
        f"{again.duplicates_skipped:,} skipped, {again.rows_inserted} inserted"
    )
    result, warm = load("bench.orders_warm")
    print(f"Spark load of {result.items_read:,} orders into an empty table, warm JVM: {warm:.1f} s")
    spark.stop()
    return cold, warm


def duckdb_load(paths: list[Path], workdir: Path) -> float:
    import duckdb

    files = ", ".join(f"'{path}'" for path in paths)
    connection = duckdb.connect()
    connection.execute("SET threads = 2")
    started = time.monotonic()
    # The same flattening and types as library.orders, written as Parquet partitioned by day.
    connection.execute(
        f"""
        COPY (
          SELECT Item->>'$.order_id.S' AS order_id, Item->>'$.customer_id.S' AS customer_id,
                 CAST(Item->>'$.amount.N' AS DECIMAL(18,2)) AS amount, Item->>'$.currency.S' AS currency,
                 CAST(Item->>'$.created_at.S' AS TIMESTAMP) AS created_at, CAST(Item->'$.items.L' AS VARCHAR) AS items,
                 CAST(Item->>'$.paid.BOOL' AS BOOLEAN) AS paid, CAST(Item AS VARCHAR) AS item,
                 CAST(CAST(Item->>'$.created_at.S' AS TIMESTAMP) AS DATE) AS created_day
          FROM read_ndjson([{files}], columns = {{'Item': 'JSON'}})
        ) TO '{workdir / "duckdb"}' (FORMAT parquet, PARTITION_BY (created_day))
        """
    )
    return time.monotonic() - started


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="ddb-athena-orders-bench-"))
    try:
        started = time.monotonic()
        paths = write_export_files(workdir)
        size = sum(path.stat().st_size for path in paths)
        print(f"Generated {ORDERS:,} orders in {FILES} gzip files ({size / 1e6:.0f} MB) in {time.monotonic() - started:.1f} s")
        duck = duckdb_load(paths, workdir)
        cold, warm = spark_load(paths, workdir)
        rows = [("Spark load, fresh JVM", cold), ("Spark load, warm JVM", warm), ("DuckDB, same transform", duck)]
        print(f"{'':28}{'seconds':>10}{'items/s':>12}{'x DuckDB':>10}")
        for name, seconds in rows:
            print(f"{name:28}{seconds:>10.1f}{ORDERS / seconds:>12,.0f}{seconds / duck:>10.1f}")
        met = ORDERS / cold >= TARGET_ITEMS_PER_SECOND
        print(f"Target {TARGET_ITEMS_PER_SECOND:,} items/s on 2 cores (fresh JVM): {'met' if met else 'not met'}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
