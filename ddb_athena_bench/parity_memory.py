"""Peak memory and seconds of the key parity check's whole look (`make bench-parity`): 200k and 1M keys of ~1 KB items,
the same on both sides (a healthy table: what every day's check compares).

Each size runs in a process of its own. Its Iceberg table is written by Spark into a local warehouse; its DynamoDB is
a scan served from memory, page by page (about 1 MB a page, as AWS's Scan returns them), unpaced: the figures are the
comparison's own cost, not the pace's. Peak RSS is measured from the look's start (the kernel's peak is reset then,
`/proc/<pid>/clear_refs`), for the driver's Python process and for its JVM (where a local Spark's executors run).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from ddb_athena.lake.change_merge import ensure_table
from ddb_athena.lake.table_keys import item_key
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.resources import IcebergSparkResource
from ddb_athena.streamed.key_parity import paced_item_digests
from ddb_athena.streamed.parity_look import whole_look
from ddb_athena_bench.bootstrap_memory import GeneratedScan

TABLE = "bench.books"
# book_item(i) (capture_rate.py) as the stream's image would put it in the item column: its wire JSON.
ITEM_SQL = (
    "to_json(named_struct('id', named_struct('S', id), 'name', named_struct('S', concat('Name ', n)), 'author', named_struct('S', 'A. Author'), "
    "'summary', named_struct('S', repeat('x', 900)), 'date', named_struct('N', cast(1700000000000000000 + n as string))))"
)


def _peak_reset(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _peak_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024


def _child(keys: int, warehouse: str) -> None:
    spark = IcebergSparkResource(profile="local", warehouse=f"file://{warehouse}", extra_config={"spark.ui.enabled": "false"}).spark_session
    spark.sparkContext.setLogLevel("ERROR")
    spec = declared("books").spec
    ensure_table(spark, spec, TABLE)
    spark.sql(
        f"INSERT INTO {TABLE} SELECT id, concat('Name ', n), 'A. Author', repeat('x', 900), CAST(NULL AS timestamp), {ITEM_SQL}, "
        "lpad(cast(n as string), 40, '0'), current_timestamp(), current_timestamp() "
        f"FROM (SELECT n, concat('book-', lpad(cast(n as string), 8, '0')) AS id FROM (SELECT id AS n FROM range({keys})))"
    )
    jvm = spark.sparkContext._gateway.proc.pid
    for pid in (os.getpid(), jvm):
        _peak_reset(pid)
    before = {"python": _peak_mib(os.getpid()), "jvm": _peak_mib(jvm)}
    scans = []

    def scan_into(sink) -> None:
        scans.append(paced_item_digests(GeneratedScan(keys), "books", partial(item_key, spec), 1e12, sink, segments=1))

    started = time.monotonic()
    look = whole_look(spark, spec, TABLE, scan_into, max_tracked_keys=100_000)
    seconds = time.monotonic() - started
    assert look.iceberg_rows == look.dynamodb_items == keys and not look.differing and not look.untracked_keys, look
    print(
        json.dumps(
            {
                "keys": keys,
                "seconds": round(seconds, 1),
                "scan_seconds": round(scans[0].seconds, 1),
                "python_rss_mib_at_start": round(before["python"]),
                "python_peak_rss_mib": round(_peak_mib(os.getpid())),
                "jvm_rss_mib_at_start": round(before["jvm"]),
                "jvm_peak_rss_mib": round(_peak_mib(jvm)),
            }
        )
    )
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--warehouse", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.warehouse)
        return
    for keys in args.keys:
        with tempfile.TemporaryDirectory(prefix="ddb-athena-bench-parity-") as warehouse:
            command = [sys.executable, "-m", __spec__.name, "--child", str(keys), "--warehouse", warehouse]
            output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
        figures = json.loads(output.stdout.strip().splitlines()[-1])
        print(
            f"{figures['keys']:>9,} keys: whole look {figures['seconds']:.1f} s (scan and spool {figures['scan_seconds']:.1f} s); peak RSS from its start: "
            f"Python {figures['python_peak_rss_mib']} MiB (at start {figures['python_rss_mib_at_start']}), "
            f"JVM {figures['jvm_peak_rss_mib']} MiB (at start {figures['jvm_rss_mib_at_start']})"
        )


if __name__ == "__main__":
    main()
