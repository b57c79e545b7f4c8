"""The sync's own capacity at the requirement's volume, past what this machine's emulator can serve
(`make bench-sync-capacity`).

The books sync run's cycles (SyncRun: capture, MERGE, commit manifest, the checks, and compaction and maintenance
between cycles), without Dagster, against a table and stream served from memory (`memory_dynamodb`): the simulator's
mix of ~1 KB writes (40% inserts, 35% updates, 17% deletes, 8% re-inserts) at `--rate` a second from a thread,
over 4 shards. Change files, checkpoints and manifests go to the emulator's S3, the warehouse to a local directory.

Freshness is exact, record by record: the time from a write to the commit of the cycle that captured it (Athena
reads the table's metadata at query time, so that is when the write becomes visible; AWS adds the stream's own
delay, under a second). It prints per minute and at the end: freshness p50/p95/max, the cycles and how many stopped
behind the stream, capture and merge seconds, the sync's CPU-s a minute (this process without the load thread, the
JVM and Spark's workers; the emulator excluded), peak memory (PSS) and JVM heap. Then it drains the stream and
compares the table's keys, read with PyIceberg from its metadata as Athena reads it, with the items'.
"""

import argparse
import json
import random
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import psutil

from ddb_athena.dev.simulate import BookSimulator, book_item
from ddb_athena.lake.table_spec import BOOKS_SPEC
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena.streamed.assets import BooksUpkeep, books_syncer, books_writer_branch, sync_cadence
from ddb_athena.streamed.check_results import cycle_check_results
from ddb_athena.streamed.sync_run import SyncRun
from ddb_athena_bench.freshness import OUT, _percentile, local_stack
from ddb_athena_bench.memory_dynamodb import MemoryDynamoDB
from ddb_athena_bench.sync_cpu import _children_cpu, _cpu
from ddb_athena_bench.volume import _books_table, _memory


class MemoryClients:
    """The `aws` resource's clients, with the memory table for DynamoDB and DynamoDB Streams."""

    def __init__(self, table: MemoryDynamoDB, aws):
        self.table, self.aws = table, aws

    def client(self, service: str):
        return self.table if service in ("dynamodb", "dynamodbstreams") else self.aws.client(service)


class PacedLoad(threading.Thread):
    """The simulator's steps at `rate` a second, in bursts every 10 ms; its own CPU is kept apart from the sync's."""

    def __init__(self, simulator: BookSimulator, rate: float):
        super().__init__(daemon=True)
        self.simulator, self.rate = simulator, rate
        self.writes, self.cpu_seconds = 0, 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self._stop_event.wait(0.01):
            due = int((time.monotonic() - started) * self.rate)
            while self.writes < due:
                self.simulator.step()
                self.writes += 1
            self.cpu_seconds = time.thread_time()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _summary(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p95": None, "max": None}
    return {"p50": _percentile(values, 0.5), "p95": _percentile(values, 0.95), "max": max(values)}


def run(rate: float, minutes: float, warm_up_minutes: float, interval: float, initial_books: int, summary_bytes: int, shards: int) -> dict:
    with local_stack(OUT / "sync-capacity-stack", rate=None, with_dagster=False) as (env, processes):
        settings = Settings.from_env(env)
        resources = resources_from_settings(settings)
        aws, spark, sync = resources["aws"], resources["spark"], resources["sync"]
        table = MemoryDynamoDB(sync.books_table, BOOKS_SPEC.key.attribute, shards)
        rng = random.Random(7)
        table.seed([book_item(f"book-{number:08d}", rng, summary_bytes) for number in range(initial_books)])
        # The memory table answers for DynamoDB and its stream; S3 is the emulator's.
        # Fenced as a deployment's sync is: each cycle publishes its branch (lake/writer_branch.py).
        writer = books_writer_branch(spark, sync, "bench")
        syncer = books_syncer(
            MemoryClients(table, aws), spark, sync, log=lambda _: None, warn=print, before_write=lambda: None, capture_seconds=interval, writer=writer
        )
        started = time.monotonic()
        syncer.cycle("bootstrap")
        print(f"bootstrap of {initial_books:,} items: {time.monotonic() - started:.0f} s", flush=True)

        # The sync run's own loop state: its checks and its upkeep between cycles, as in a Dagster run.
        run = SyncRun(
            syncer,
            sync_cadence(sync, interval),
            checks=lambda *when: cycle_check_results(aws, spark, sync, *when),
            upkeep=BooksUpkeep(spark, sync, writer=writer),
        )
        simulator = BookSimulator(table, sync.books_table, rng=rng, summary_bytes=summary_bytes)
        simulator.load_existing_ids()
        load = PacedLoad(simulator, rate)
        me, excluded = psutil.Process(), {process.pid for process in processes.values()}
        load.start()
        load_started = time.monotonic()
        measuring_from = load_started + warm_up_minutes * 60
        cycles, freshness = [], []
        cpu_at_start, peak_python, peak_jvm, peak_heap = None, 0.0, 0.0, 0.0
        minute_at, minute_freshness = time.monotonic(), []
        number = 0
        while time.monotonic() < measuring_from + minutes * 60:
            number += 1
            cycle_started = time.monotonic()
            measuring = cycle_started >= measuring_from
            if measuring and cpu_at_start is None:
                cpu_at_start = (_cpu(me) - load.cpu_seconds, _children_cpu(me, excluded), load.writes, cycle_started)
            outcome = run.cycle(f"cycle-{number}").outcome
            # When the commit was done (the merge's lag is measured then), not after the checks and upkeep that follow.
            merged = outcome.merged
            committed_at = (
                datetime.fromisoformat(merged["newest_change_at"]) + timedelta(seconds=merged["lag_seconds"])
                if merged.get("newest_change_at")
                else datetime.now(UTC)
            )
            ages = [(committed_at - written).total_seconds() for written in table.take_served()]
            python_memory, _ = _memory({me.pid})
            jvm_memory, heap = _memory({child.pid for child in me.children(recursive=True)} - excluded)
            if measuring:
                freshness.extend(ages)
                minute_freshness.extend(ages)
                peak_python, peak_jvm, peak_heap = max(peak_python, python_memory), max(peak_jvm, jvm_memory), max(peak_heap, heap or 0.0)
                cycles.append(
                    {
                        "seconds": time.monotonic() - cycle_started,
                        "capture_seconds": outcome.source.get("duration_seconds", 0.0),
                        "merge_seconds": outcome.merged.get("duration_seconds", 0.0),
                        "records": outcome.source.get("records_captured", 0),
                        "behind": not outcome.source.get("stream_caught_up", True),
                    }
                )
            if time.monotonic() - minute_at >= 60:
                shown = _summary(minute_freshness)
                print(
                    f"minute {(time.monotonic() - load_started) / 60:4.1f}{' (warm-up)' if not measuring else ''}: {load.writes:,} writes, "
                    f"freshness p50/p95/max {shown['p50'] or 0:.1f}/{shown['p95'] or 0:.1f}/{shown['max'] or 0:.1f} s, "
                    f"last cycle {time.monotonic() - cycle_started:.1f} s, waiting {table.records_waiting():,}, "
                    f"PSS JVM and workers {jvm_memory:,.0f} MiB, this process {python_memory:,.0f} MiB",
                    flush=True,
                )
                minute_at, minute_freshness = time.monotonic(), []
            time.sleep(max(0.0, cycle_started + interval - time.monotonic()))
        elapsed_minutes = (time.monotonic() - cpu_at_start[3]) / 60
        load.stop()
        python_cpu = _cpu(me) - load.cpu_seconds - cpu_at_start[0]
        jvm_cpu = _children_cpu(me, excluded) - cpu_at_start[1]
        waiting_at_end = table.records_waiting()
        # Drained, the table holds exactly the items: nothing lost, nothing resurrected at this rate.
        while table.records_waiting():
            syncer.cycle(f"drain-{number}")
            number += 1
        # Read back as Athena reads it: PyIceberg, from the table's newest metadata, not the Spark session that wrote it.
        keys = set(_books_table(settings, env["AWS_ENDPOINT_URL"]).scan(selected_fields=(BOOKS_SPEC.key.name,)).to_arrow().column(0).to_pylist())
        return {
            "rate": rate,
            "achieved_writes_per_second": (load.writes - cpu_at_start[2]) / (elapsed_minutes * 60),
            "minutes": elapsed_minutes,
            "interval_seconds": interval,
            "shards": shards,
            "summary_bytes": summary_bytes,
            "initial_books": initial_books,
            "freshness_seconds": _summary(freshness),
            "records_measured": len(freshness),
            "records_waiting_at_end": waiting_at_end,
            "cycles": len(cycles),
            "cycles_behind": sum(cycle["behind"] for cycle in cycles),
            "cycle_seconds": _summary([cycle["seconds"] for cycle in cycles]),
            "capture_seconds_median": statistics.median(cycle["capture_seconds"] for cycle in cycles),
            "merge_seconds": _summary([cycle["merge_seconds"] for cycle in cycles]),
            "records_per_cycle_median": statistics.median(cycle["records"] for cycle in cycles),
            "sync_cpu_seconds_per_minute": {"python": python_cpu / elapsed_minutes, "jvm_and_workers": jvm_cpu / elapsed_minutes},
            "load_cpu_seconds_per_minute": load.cpu_seconds / ((time.monotonic() - load_started) / 60),
            "peak_pss_mib": {"jvm_and_workers": peak_jvm, "python_with_memory_table": peak_python},
            "peak_jvm_heap_mib": peak_heap,
            "rows_at_end": len(keys),
            "items_at_end": len(table.items),
            "table_equals_items": keys == set(table.items),
        }


def report(result: dict) -> str:
    fresh, merge, cycle = result["freshness_seconds"], result["merge_seconds"], result["cycle_seconds"]
    cpu = result["sync_cpu_seconds_per_minute"]
    return "\n".join(
        [
            f"`make bench-sync-capacity` (RATE={result['rate']:g} MINUTES={result['minutes']:.0f}): {result['achieved_writes_per_second']:.0f} "
            f"writes/s achieved over {result['shards']} shards, a cycle every {result['interval_seconds']:g} s, "
            f"{result['initial_books']:,} books to start; drained, {result['rows_at_end']:,} rows and {result['items_at_end']:,} items, "
            f"{'the same keys' if result['table_equals_items'] else 'NOT the same keys'}.",
            "",
            "| freshness p50 / p95 / max | cycles (behind) | cycle s p50 / p95 / max | merge s p50 / p95 / max | capture s | records a cycle "
            "| sync CPU-s/min (Python + JVM) | peak PSS MiB: JVM and workers / Python (with the memory table) | JVM heap MiB | waiting at end |",
            "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {fresh['p50']:.1f} / {fresh['p95']:.1f} / {fresh['max']:.1f} s | {result['cycles']} ({result['cycles_behind']}) "
            f"| {cycle['p50']:.1f} / {cycle['p95']:.1f} / {cycle['max']:.1f} | {merge['p50']:.1f} / {merge['p95']:.1f} / {merge['max']:.1f} "
            f"| {result['capture_seconds_median']:.1f} | {result['records_per_cycle_median']:,.0f} | {cpu['python']:.1f} + {cpu['jvm_and_workers']:.1f} "
            f"| {result['peak_pss_mib']['jvm_and_workers']:,.0f} / {result['peak_pss_mib']['python_with_memory_table']:,.0f} "
            f"| {result['peak_jvm_heap_mib']:,.0f} | {result['records_waiting_at_end']:,} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=250.0, help="writes a second")
    parser.add_argument("--minutes", type=float, default=10.0, help="measured, after the warm-up")
    parser.add_argument("--warm-up-minutes", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds from one cycle's start to the next")
    parser.add_argument("--initial-books", type=int, default=100_000)
    parser.add_argument("--summary-bytes", type=int, default=700, help="makes the items ~1 KB")
    parser.add_argument("--shards", type=int, default=4, help="AWS spreads 230 writes/s of ~1 KB over about 4")
    arguments = parser.parse_args(argv)
    result = run(
        arguments.rate, arguments.minutes, arguments.warm_up_minutes, arguments.interval, arguments.initial_books, arguments.summary_bytes, arguments.shards
    )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sync-capacity.json").write_text(json.dumps(result, indent=2))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
