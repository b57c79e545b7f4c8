"""`make bench-requests`: the AWS requests one books sync cycle makes, counted by the emulator, by step and kind.

The cycle code without Dagster (as `bench-sync-cpu`), its warehouse on the emulator's S3 through S3A, so that every
request a commit makes reaches the emulator: the capture's (DynamoDB Streams, S3), the merge's (S3 through S3A: the
change files read, the table's data, delete and metadata files written and read; the Hadoop catalog's version hint),
and the per-cycle checks'. The simulator's own writes to DynamoDB are left out. Prints the mean requests a cycle by
step and operation, and the Iceberg commits a cycle to each table; then the PUTs and GETs a cycle of each table's
files by kind (data, position deletes, manifest, manifest list, metadata); then the totals per cycle and per commit.

    .venv/bin/python -m ddb_athena_bench.commit_requests [--cycles 30] [--interval 10] [--rate 10]
"""

import argparse
import collections
import os
import sys
import time

from ddb_athena.lib.declarations import declared
from ddb_athena.streamed.check_results import cycle_check_results
from ddb_athena_bench.counting_emulator import FILE_COUNTS_PATH
from ddb_athena_bench.freshness import OUT, request_counts
from ddb_athena_bench.sync_cpu import TABLE_CHECKS_EVERY, warm_sync

WARM_UP_CYCLES = 4
# The simulator's writes: load, not the sync's requests.
LOAD_OPERATIONS = {"dynamodb PutItem", "dynamodb UpdateItem", "dynamodb DeleteItem", "dynamodb BatchWriteItem"}
STEPS = ("capture", "merge", "checks")


def _snapshots(session, table: str) -> int:
    return session.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0]


def _s3_class(operation: str) -> str:
    """The price class of an S3 request: GET and HEAD are billed at the GET rate, the rest at the PUT rate."""
    return "GET" if operation.split()[1] in ("GetObject", "HeadObject") else "PUT"


def run(cycles: int, interval: float, rate: float) -> dict:
    with warm_sync(OUT / "requests-stack", interval, WARM_UP_CYCLES, rate=rate, warehouse_on_s3=True) as (resources, syncer, _):
        aws, spark, sync = resources["aws"], resources["spark"], resources["sync"]
        endpoint = os.environ["AWS_ENDPOINT_URL"]
        session = spark.spark_session
        books = sync.iceberg_table_of(declared("books"))
        tables = {"books": books, "tombstones": f"{books}_tombstones"}
        by_step = {step: collections.Counter() for step in STEPS}
        commits, files = collections.Counter(), collections.Counter()
        merged_cycles = 0
        for number in range(1, cycles + 1):
            started = time.monotonic()
            before = {name: _snapshots(session, table) for name, table in tables.items()}
            request_counts(endpoint, reset=True)
            request_counts(endpoint, reset=True, path=FILE_COUNTS_PATH)
            source = syncer.capture(False)
            by_step["capture"].update(request_counts(endpoint, reset=True))
            merged = syncer.merge(f"cycle-{number}")
            by_step["merge"].update(request_counts(endpoint, reset=True))
            cycle_check_results(aws, sync, declared("books"), list_s3=number % TABLE_CHECKS_EVERY == 0)
            by_step["checks"].update(request_counts(endpoint, reset=True))
            files.update(request_counts(endpoint, reset=True, path=FILE_COUNTS_PATH))
            merged_cycles += merged is not None
            for name, table in tables.items():
                commits[name] += _snapshots(session, table) - before[name]
            print(f"cycle {number}: {source.get('records_captured', 0)} records captured, {'merged' if merged else 'idle'}", flush=True)
            time.sleep(max(0.0, started + interval - time.monotonic()))
    for counts in by_step.values():
        for operation in LOAD_OPERATIONS:
            counts.pop(operation, None)
    return {"cycles": cycles, "interval": interval, "rate": rate, "merged_cycles": merged_cycles, "by_step": by_step, "commits": commits, "files": files}


def report(result: dict) -> str:
    cycles = result["cycles"]
    commits = sum(result["commits"].values())
    lines = [
        f"{cycles} cycles {result['interval']:g} s apart, simulator at {result['rate']:g} writes/s, {result['merged_cycles']} cycles merged; "
        f"Iceberg commits a cycle: " + ", ".join(f"{name} {count / cycles:.2f}" for name, count in result["commits"].items()),
        "",
        "| step | request | per cycle |",
        "| --- | --- | --- |",
    ]
    totals: collections.Counter = collections.Counter()
    for step, counts in result["by_step"].items():
        for operation, count in sorted(counts.items(), key=lambda item: -item[1]):
            lines.append(f"| {step} | {operation} | {count / cycles:.1f} |")
            if operation.startswith("s3 "):
                totals[f"S3 {_s3_class(operation)}-class"] += count
            else:
                totals[operation.split()[0]] += count
    # What the commits write and read, file by file (the version hint is the local catalog's alone, not on AWS).
    lines += ["", "| table | file | PUT a cycle | GET a cycle |", "| --- | --- | --- | --- |"]
    by_file: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for request, count in result["files"].items():
        operation, table, kind = request.split(" ", 2)
        by_file[(table, kind)][operation] += count
    lines += [
        f"| {table} | {kind} | {counts['PutObject'] / cycles:.2f} | {counts['GetObject'] / cycles:.2f} |"
        for (table, kind), counts in sorted(by_file.items())
        if counts["PutObject"] or counts["GetObject"]
    ]
    lines += ["", "| in all | per cycle | per commit |", "| --- | --- | --- |"]
    lines += [
        f"| {kind} | {count / cycles:.1f} | {count / commits:.1f} |" if commits else f"| {kind} | {count / cycles:.1f} | |" for kind, count in totals.items()
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds from one cycle's start to the next")
    parser.add_argument("--rate", type=float, default=10.0, help="the simulator's writes a second")
    arguments = parser.parse_args(argv)
    print(report(run(arguments.cycles, arguments.interval, arguments.rate)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
