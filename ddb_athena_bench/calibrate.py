"""`make bench-calibrate`: how fast this host is right now, as the CPU seconds of a fixed amount of work.

The same code measured 2.3 and 3.4 CPU-s a sync cycle an hour apart on this host (docs/performance-log.md), so a
before/after that spans a sitting is read against a calibration taken before and after each cell: the figures below
move with the host, not with the code. Two fixed workloads, each its own kind of CPU:
- Python: JSON and hashing of a fixed document, as the run's own Python does (capture, DynamoDB JSON);
- Spark: a new local session (the class archive, as every local session), then rounds of the class archive's own
  workload (a merge-on-read table written, merged, deleted from, read, listed, compacted and expired), its table
  dropped after each: the JVM's start and cold first round, and the warm rounds after it.

    .venv/bin/python -m ddb_athena_bench.calibrate --rounds 5
"""

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time

import psutil

from ddb_athena_bench.sync_cpu import _children_cpu
from ddb_athena_build.class_archive import run_workload

PYTHON_DOCUMENTS = 40_000
DOCUMENT = {"id": {"S": "book-0001"}, "name": {"S": "x" * 200}, "price": {"N": "12.50"}, "tags": {"L": [{"S": f"tag-{i}"} for i in range(20)]}}


def python_cpu_seconds() -> float:
    started = time.process_time()
    digest = hashlib.sha256()
    for number in range(PYTHON_DOCUMENTS):
        text = json.dumps({**DOCUMENT, "n": {"N": str(number)}}, sort_keys=True)
        digest.update(json.loads(text)["name"]["S"].encode())
    return time.process_time() - started


def spark_rounds(rounds: int) -> list[tuple[float, float]]:
    """(JVM and Python CPU seconds, wall seconds) of the session's start with its first round, then of each round."""
    from ddb_athena.lib.resources import IcebergSparkResource

    measured, me = [], psutil.Process()
    with tempfile.TemporaryDirectory(prefix="ddb_athena_calibrate_") as warehouse:
        cpu, wall = _children_cpu(me, set()) + time.process_time(), time.monotonic()
        spark = IcebergSparkResource(profile="local", warehouse=f"file://{warehouse}").spark_session
        spark.sparkContext.setLogLevel("ERROR")
        for _ in range(rounds + 1):
            run_workload(spark)
            spark.sql("DROP TABLE lake.archive.changes PURGE")
            now_cpu, now_wall = _children_cpu(me, set()) + time.process_time(), time.monotonic()
            measured.append((now_cpu - cpu, now_wall - wall))
            cpu, wall = now_cpu, now_wall
        spark.stop()
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The CPU seconds of a fixed amount of work: this host's speed now.")
    parser.add_argument("--rounds", type=int, default=5, help="warm rounds of the Spark workload after the first")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    python = python_cpu_seconds()
    (start_cpu, start_wall), *warm = spark_rounds(args.rounds)
    warm_cpu = [cpu for cpu, _ in warm]
    print(f"python: {python:.2f} CPU-s for {PYTHON_DOCUMENTS} documents")
    print(f"spark start and first round: {start_cpu:.1f} CPU-s, {start_wall:.1f} s")
    print(
        f"spark warm round: {statistics.mean(warm_cpu):.2f} CPU-s (median {statistics.median(warm_cpu):.2f}, "
        f"{min(warm_cpu):.2f}-{max(warm_cpu):.2f} over {len(warm_cpu)}), {statistics.mean(wall for _, wall in warm):.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
