"""Benchmark of the books path on this machine: bootstrap load, minute merges, maintenance.

Run with `make bench`. Prints figures; asserts nothing (targets live here, not in tests). At the requirement's
volume (230 writes a second of ~1 KB, a cycle every 10 s): `--changes 2500 --summary-bytes 700`.
"""

import argparse
import random
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta

from ddb_athena.dev.local_stack import start_moto_server
from ddb_athena.lake.change_merge import merge_change_files
from ddb_athena.lake.maintenance import maintain_table
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.resources import IcebergSparkResource
from ddb_athena.lib.settings import Settings
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeRecord, change_file_name, write_change_file

MERGES = 6
PORT = 5099


def book(book_id: str, sequence: int, event: str, rng: random.Random, summary_bytes: int) -> ChangeRecord:
    image = None
    if event != "REMOVE":
        image = {
            "id": {"S": book_id},
            "name": {"S": f"Book {rng.random():.6f}"},
            "author": {"S": rng.choice(["Ada", "Lin", "Maria", "Jonas"])},
            "summary": {"S": "x" * summary_bytes},
            "date": {"N": str(rng.randrange(10**18))},
            "tags": {"SS": ["a", "b"]},
        }
    return ChangeRecord(event, {"id": {"S": book_id}}, image, str(sequence), "2026-11-22T03:00:00.000000Z")


def main(argv: list[str] | None = None) -> None:
    import logging

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows in the table before the merges")
    parser.add_argument("--changes", type=int, default=1_000, help="changes in each merge")
    parser.add_argument("--summary-bytes", type=int, default=120, help="size of each book's summary (700: ~1 KB items)")
    args = parser.parse_args(argv)
    table_rows, changes_per_merge = args.rows, args.changes

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = start_moto_server(PORT)
    endpoint = f"http://127.0.0.1:{PORT}"
    warehouse = tempfile.mkdtemp(prefix="ddb-athena-bench-")
    settings = Settings.from_env({"AWS_ENDPOINT_URL": endpoint, "DDB_ATHENA_WAREHOUSE": f"file://{warehouse}", "DDB_ATHENA_BUCKET": "bench"})
    s3 = settings.client("s3")
    s3.create_bucket(Bucket="bench")
    layout = SourceLayout("bench", "books_source")
    rng = random.Random(1)
    started = time.monotonic()
    spark = IcebergSparkResource(
        profile="local",
        warehouse=settings.warehouse,
        s3_endpoint_url=endpoint,
        access_key_id="testing",
        secret_access_key="testing",
        extra_config={"spark.ui.enabled": "false"},
    ).spark_session
    spark.sparkContext.setLogLevel("ERROR")
    print(f"SparkSession start: {time.monotonic() - started:.1f} s")
    table = "bench.books"
    t0 = datetime(2026, 11, 22, tzinfo=UTC)

    ids = [f"book-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}" for _ in range(table_rows)]
    snapshot = write_change_file(s3, layout, change_file_name(t0, "snapshot"), (book(i, 0, "SNAPSHOT", rng, args.summary_bytes) for i in ids))
    started = time.monotonic()
    merge_change_files(spark, declared("books").spec, table, [layout.uri(snapshot, "s3a")], layout.uri(layout.quarantine_prefix, "s3a"))
    load = time.monotonic() - started
    print(f"Bootstrap load of {table_rows:,} items: {load:.1f} s ({table_rows / load:,.0f} items/s, first MERGE in the session)")

    timings, sequence, live = [], 1, list(ids)
    for number in range(MERGES):
        records = []
        for _ in range(changes_per_merge):
            sequence += 1
            roll = rng.random()
            if roll < 0.6:
                records.append(book(rng.choice(live), sequence, "MODIFY", rng, args.summary_bytes))
            elif roll < 0.8:
                records.append(book(live.pop(rng.randrange(len(live))), sequence, "REMOVE", rng, args.summary_bytes))
            else:
                new_id = f"book-new-{sequence}"
                live.append(new_id)
                records.append(book(new_id, sequence, "INSERT", rng, args.summary_bytes))
        key = write_change_file(s3, layout, change_file_name(t0 + timedelta(minutes=number + 1), "stream"), records)
        started = time.monotonic()
        result = merge_change_files(spark, declared("books").spec, table, [layout.uri(key, "s3a")], layout.uri(layout.quarantine_prefix, "s3a"))
        timings.append(time.monotonic() - started)
        print(f"  merge {number + 1}: {timings[-1]:.2f} s ({result.rows_written} rows written, {result.rows_removed} removed)")
    warm = timings[1:]
    print(f"MERGE of {changes_per_merge:,} changes into {table_rows // 1000}k rows: median {statistics.median(warm):.2f} s warm, first {timings[0]:.2f} s")
    rows = spark.table(table).count()
    assert rows == len(live), (rows, len(live))

    started = time.monotonic()
    result = maintain_table(spark, "lake", table, timedelta(hours=6), 1, timedelta(days=7))
    print(f"Maintenance (compaction of {result.rewritten_data_files} files + expiry): {time.monotonic() - started:.1f} s")
    spark.stop()
    server.stop()


if __name__ == "__main__":
    main()
