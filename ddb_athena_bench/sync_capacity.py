"""The sync's own capacity at the requirement's volume, past what this machine's emulator can serve
(`make bench-sync-capacity`).

The books sync run's cycles (SyncRun: capture, MERGE, commit manifest, the checks, and compaction and tombstone
pruning between cycles; expiry and orphans are the upkeep runs', beside the loop), without Dagster, against a table
and stream served from memory (`memory_dynamodb`): the simulator's mix of ~1 KB writes (40% inserts, 35% updates,
17% deletes, 8% re-inserts) at `--rate` a second from a thread, over 4 shards. Change files, checkpoints and
manifests go to the emulator's S3, the warehouse to a local directory.

Freshness is exact, record by record: the time from a write to the commit of the cycle that captured it (Athena
reads the table's metadata at query time, so that is when the write becomes visible; AWS adds the stream's own
delay, under a second). It prints per minute and at the end: freshness p50/p95/max, the cycles and how many stopped
behind the stream, capture and merge seconds, the sync's CPU-s a minute (this process without the load thread, the
JVM and Spark's workers; the emulator excluded), peak memory (PSS) and JVM heap. Then it drains the stream and
compares the table's keys, read with PyIceberg from its metadata as Athena reads it, with the items'.
"""

import argparse
import functools
import gc
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

import psutil

from ddb_athena.dev.local_stack import create_dynamodb_table
from ddb_athena.dev.simulate import BookSimulator, SeededTraffic, book_item, seed_items
from ddb_athena.lake.identifiers import dotted_name, string_literal, validate_identifier
from ddb_athena.lake.table_spec import ITEM_COLUMN
from ddb_athena.lib.declarations import FRESHNESS_INTERVALS, TableDeclaration, declared
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena.streamed.assets import StreamedUpkeep, stream_syncer, sync_cadence, writer_branch_of
from ddb_athena.streamed.check_results import cycle_check_results
from ddb_athena.streamed.sync_run import CycleReport, SyncRun, TableCadence, cycle_in_turns, table_cadences
from ddb_athena_bench.freshness import OUT, _percentile, local_stack
from ddb_athena_bench.memory_dynamodb import COPY_SEPARATOR, MemoryDynamoDB
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


@dataclass
class CapacityStack:
    """The emulator (S3 only), the settings and resources pointing at it, and the books table and stream in memory,
    bootstrapped into library.books: what each measurement (`measure`) runs against."""

    env: dict
    settings: Settings
    resources: dict
    table: MemoryDynamoDB
    rng: random.Random
    processes: dict
    summary_bytes: int


@contextmanager
def capacity_stack(
    scratch: Path,
    initial_books: int,
    summary_bytes: int,
    shards: int,
    warehouse_on_s3: bool = False,
    spark_memory: str | None = None,
    limits=None,
    copies: int = 1,
    event_log: Path | None = None,
) -> Iterator[CapacityStack]:
    """`spark_memory`: the JVM's heap (`spark.driver.memory`). `event_log`: a directory for Spark's event log (every
    stage's metrics; `stage_metrics.py` reads it). `limits` (task_limits.TaskLimits): the task's size,
    entered once the emulator runs and the table is seeded, before the JVM starts. `copies` > 1: after the bootstrap,
    the table holds that many of each item, written into Iceberg by Spark (`copy_rows`, every core) and held by the
    memory table as they are read (`CopiedItems`): a table ten times as large as this process can seed."""
    with local_stack(scratch, rate=None, with_dagster=False, warehouse_on_s3=warehouse_on_s3) as (env, processes), ExitStack() as limited:
        table = MemoryDynamoDB(Settings.from_env(env).dynamodb_tables["books"], declared("books").spec.key.attribute, shards)
        rng = random.Random(7)
        table.seed([book_item(f"book-{number:08d}", rng, summary_bytes) for number in range(initial_books)])
        # The table served from memory is millions of objects in this process, which a run worker would not hold:
        # kept out of the garbage collector's passes, which otherwise stopped the sync's threads for tens of seconds.
        gc.freeze()
        if limits is not None:
            limited.enter_context(limits)
            env = {**env, "DDB_ATHENA_SPARK_MASTER": limits.spark_master}
        settings = Settings.from_env(env)
        resources = resources_from_settings(settings)
        extra = {"spark.driver.memory": spark_memory} if spark_memory else {}
        if event_log is not None:
            event_log.mkdir(parents=True, exist_ok=True)
            extra.update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log.as_uri(), "spark.eventLog.compress": "false"})
        if extra:
            spark = resources["spark"]
            fields = {name: getattr(spark, name) for name in type(spark).model_fields}
            resources["spark"] = type(spark)(**{**fields, "extra_config": {**spark.extra_config, **extra}})
        stack = CapacityStack(env, settings, resources, table, rng, processes, summary_bytes)
        started = time.monotonic()
        _syncer(stack, MemoryClients(table, resources["aws"])).cycle("bootstrap")
        print(f"bootstrap of {initial_books:,} items: {time.monotonic() - started:.0f} s", flush=True)
        if copies > 1:
            started = time.monotonic()
            with limits.cpu_unlimited() if limits is not None else nullcontext():
                copy_rows(resources["spark"].spark_session, resources["sync"].iceberg_table_of(declared("books")), declared("books"), copies)
            table.copy_items(copies)
            print(f"copied by Spark to {len(table.items):,} items: {time.monotonic() - started:.0f} s", flush=True)
        yield stack


def copy_rows(spark, iceberg_table: str, declaration: TableDeclaration, copies: int) -> None:
    """Appends to `iceberg_table` (on `main`) `copies - 1` more of each row, as `CopiedItems` holds them: the key
    `<key>~<n>`, in its column and in the item's JSON, every other column as it is (their sequence numbers older than
    any change in the stream, as a bootstrap's are)."""
    spec = declaration.spec
    if spec.sort_key is not None or spec.key.transform != "string":
        raise ValueError(f"{declaration.name}: only a table keyed by one string attribute is copied")
    key = validate_identifier(spec.key.name)
    copied_key = f"concat({key}, '{COPY_SEPARATOR}', copy_number)"
    # The key attribute in the item's JSON as the sync writes it (compact): "id":{"S":"book-1"}.
    attribute = string_literal(json.dumps(spec.key.attribute) + ":")

    def in_item(value: str) -> str:
        return f"concat({attribute}, to_json(named_struct('S', {value})))"

    columns = [validate_identifier(column) for column in spark.table(iceberg_table).columns]
    copied = {key: copied_key, ITEM_COLUMN: f"replace({ITEM_COLUMN}, {in_item(key)}, {in_item(copied_key)})"}
    selected = [f"{copied[column]} AS {column}" if column in copied else column for column in columns]
    table = dotted_name(iceberg_table)
    spark.sql(f"INSERT INTO {table} SELECT {', '.join(selected)} FROM {table} LATERAL VIEW explode(sequence(1, {int(copies) - 1})) copied AS copy_number")


def _writer(stack: CapacityStack, table: TableDeclaration):
    """Fenced as a deployment's sync is: each cycle publishes its branch (lake/writer_branch.py)."""
    return writer_branch_of(stack.resources["spark"], stack.resources["sync"], "bench", 1, table)


def _syncer(stack: CapacityStack, clients, before_write: Callable[[], None] = lambda: None, interval: float | None = None, writer=None, table=None):
    """A sync run's cycle state of `table` (default books, on the memory table and stream: `clients`)."""
    spark, sync = stack.resources["spark"], stack.resources["sync"]
    table = table or declared("books")
    writer = writer or _writer(stack, table)
    return stream_syncer(clients, spark, sync, table, log=lambda _: None, warn=print, before_write=before_write, capture_seconds=interval, writer=writer)


def table_run(stack: CapacityStack, table: TableDeclaration, clients, before_write: Callable[[], None], interval: float, instruments=None):
    """A table's cycles as a sync run's TableInRun makes them (streamed/assets.py: syncer, checks, upkeep, all fenced),
    each step reported to `instruments`. The run, and its upkeep (whose passes the caller may time)."""
    aws, spark, sync = stack.resources["aws"], stack.resources["spark"], stack.resources["sync"]
    writer = _writer(stack, table)
    syncer = _syncer(stack, instruments.clients(clients) if instruments else clients, before_write, interval, writer, table)
    checks = lambda *when: cycle_check_results(aws, sync, table, *when)  # noqa: E731
    upkeep = StreamedUpkeep(spark, sync, table, before_write=before_write, writer=writer)
    if instruments:
        syncer.capture, syncer.merge = instruments.step("capture", syncer.capture), instruments.step("merge", syncer.merge)
        checks = instruments.step("checks", checks)
        upkeep.compact, upkeep.prune_tombstones = instruments.step("compaction", upkeep.compact), instruments.step("pruning", upkeep.prune_tombstones)
    return SyncRun(syncer, sync_cadence(sync, interval), checks=checks, upkeep=upkeep), upkeep


def small_tables(count: int, interval: float | None = None) -> list[TableDeclaration]:
    """`count` small streamed tables shaped as the reviews declaration (a composite key): small_1, small_2, ...; declared
    with their own merge `interval` (None: the run's) and the freshness bound it needs."""
    reviews = declared("reviews")
    freshness = max(reviews.freshness, timedelta(seconds=FRESHNESS_INTERVALS * (interval or 0.0)))
    return [
        replace(
            reviews,
            name=name,
            dynamodb_table=name.replace("_", "-"),
            dynamodb_table_variable=None,
            spec=replace(reviews.spec, table=name),
            merge_interval_seconds=interval,
            freshness=freshness,
        )
        for name in (f"small_{number}" for number in range(1, count + 1))
    ]


@dataclass
class TableBeside:
    """A further streamed table in the books sync's loop, as a sync run keeps every streamed table in one JVM: its
    DynamoDB table and stream on the emulator, written from its seed items (the reviews') at `rate` a second."""

    table: TableDeclaration
    rate: float
    before_write: Callable[[], None] = lambda: None
    load: "PacedLoad | None" = field(default=None, init=False)

    def start(self, stack: CapacityStack, interval: float, instruments=None) -> SyncRun:
        dynamodb = stack.resources["aws"].client("dynamodb")
        name = stack.resources["sync"].dynamodb_table_of(self.table)
        create_dynamodb_table(dynamodb, name, self.table)
        traffic = SeededTraffic(dynamodb, self.table, name, seed_items("reviews"), random.Random(name))
        traffic.seed()
        run, _ = table_run(stack, self.table, stack.resources["aws"], self.before_write, self.table.merge_interval_seconds or interval, instruments)
        run.cycle(f"{self.table.name}-bootstrap", bootstrap=True)
        self.load = PacedLoad(traffic, self.rate)
        self.load.start()
        if instruments:
            instruments.load_started(self.load)
        return run


class Instruments(Protocol):
    """What a measurement reports to, beside its own figures: each step of the loop by name (`capture`, `merge`,
    `checks`, `compaction`, `pruning`) around its call, the memory table's calls, and the load generator's thread."""

    def step(self, name: str, call: Callable) -> Callable: ...

    def clients(self, clients: "MemoryClients") -> object: ...

    def load_started(self, thread: threading.Thread) -> None: ...


def measure(
    stack: CapacityStack,
    rate: float,
    interval: float,
    minutes: float,
    warm_up_minutes: float,
    before_write: Callable[[], None] = lambda: None,
    instruments: Instruments | None = None,
    beside: list[TableBeside] = (),
) -> dict:
    """A sync run's loop (its checks and upkeep between cycles, as in a Dagster run) for `warm_up_minutes`, then
    `minutes` measured, under the simulator's writes at `rate` a second; each cycle also syncs the tables `beside`
    books that their cadences have due, after it (their loads running throughout), as a sync run does."""
    aws, sync = stack.resources["aws"], stack.resources["sync"]
    table = stack.table
    run, upkeep = table_run(stack, declared("books"), MemoryClients(table, aws), before_write, interval, instruments)
    # How long each upkeep pass held the loop (the next cycle waits for it).
    pass_seconds: dict[str, list[float]] = {"compaction": [], "pruning": []}
    upkeep.compact, upkeep.prune_tombstones = _timed(upkeep.compact, "compaction", pass_seconds), _timed(upkeep.prune_tombstones, "pruning", pass_seconds)
    beside_runs = [other.start(stack, interval, instruments) for other in beside]
    side_by_side = ThreadPoolExecutor(max_workers=len(beside) + 1, thread_name_prefix="table-beside")
    intervals = [interval, *(other.table.merge_interval_seconds or interval for other in beside)]
    books_cadence, *beside_cadences = table_cadences(intervals, stack.resources["sync"].merge_buffer_changes)
    simulator = BookSimulator(table, sync.dynamodb_tables["books"], rng=stack.rng, summary_bytes=stack.summary_bytes)
    simulator.load_existing_ids()
    gc.freeze()
    load = PacedLoad(simulator, rate)
    me, excluded = psutil.Process(), {process.pid for process in stack.processes.values()}

    def loads_cpu() -> float:
        return load.cpu_seconds + sum(other.load.cpu_seconds for other in beside)

    table.take_served()
    load.start()
    if instruments:
        instruments.load_started(load)
    load_started = time.monotonic()
    measuring_from = load_started + warm_up_minutes * 60
    cycles, freshness = [], []
    cpu_at_start, peak_python, peak_jvm, peak_heap = None, 0.0, 0.0, 0.0
    minute_at, minute_freshness = time.monotonic(), []
    number, upkeep_passes = 0, {"compaction": 0, "pruning": 0}
    while time.monotonic() < measuring_from + minutes * 60:
        number += 1
        cycle_started = time.monotonic()
        measuring = cycle_started >= measuring_from
        if measuring and cpu_at_start is None:
            cpu_at_start = (_cpu(me) - loads_cpu(), _children_cpu(me, excluded), load.writes, cycle_started)
        # Books and the tables beside that are due, in a sync run's turns (`cycle_in_turns`): books first, being at the
        # run's interval; then the slower ones, each as it fits what is left of the interval.
        due = [(run, books_cadence), *((other, cadence) for other, cadence in zip(beside_runs, beside_cadences, strict=True) if cadence.due(cycle_started))]
        cycle_of = functools.partial(_cadenced_cycle, stack, f"cycle-{number}", cycle_started)
        reports = dict(cycle_in_turns(due, lambda entry: entry[1], cycle_of, cycle_started, time.monotonic, side_by_side))
        report = reports[run]
        outcome = report.outcome
        # When the commit was done (the merge's lag is measured then), not after the checks and upkeep that follow.
        merged = outcome.merged
        newest = merged.get("newest_change_at")
        committed_at = datetime.fromisoformat(newest) + timedelta(seconds=merged["lag_seconds"]) if newest else datetime.now(UTC)
        ages = [(committed_at - written).total_seconds() for written in table.take_served()]
        python_memory, _ = _memory({me.pid})
        jvm_memory, heap = _memory({child.pid for child in me.children(recursive=True)} - excluded)
        if not measuring:
            for held in pass_seconds.values():
                held.clear()
        if measuring:
            freshness.extend(ages)
            minute_freshness.extend(ages)
            peak_python, peak_jvm, peak_heap = max(peak_python, python_memory), max(peak_jvm, jvm_memory), max(peak_heap, heap or 0.0)
            upkeep_passes["pruning"] += report.pruned_tombstones is not None
            upkeep_passes["compaction"] += any(message.startswith("Compaction") for message in report.messages)
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
    side_by_side.shutdown(wait=True)
    elapsed_minutes = (time.monotonic() - cpu_at_start[3]) / 60
    load.stop()
    for other in beside:
        other.load.stop()
    python_cpu = _cpu(me) - loads_cpu() - cpu_at_start[0]
    jvm_cpu = _children_cpu(me, excluded) - cpu_at_start[1]
    return {
        "rate": rate,
        "achieved_writes_per_second": (load.writes - cpu_at_start[2]) / (elapsed_minutes * 60),
        "minutes": elapsed_minutes,
        "interval_seconds": interval,
        "tables_beside": [
            {"table": other.table.name, "rate": other.rate, "writes": other.load.writes, "interval_seconds": other.table.merge_interval_seconds or interval}
            for other in beside
        ],
        "shards": len(table.describe_stream(table.stream_arn)["StreamDescription"]["Shards"]),
        "summary_bytes": stack.summary_bytes,
        "freshness_seconds": _summary(freshness),
        "records_measured": len(freshness),
        "records_waiting_at_end": table.records_waiting(),
        "cycles": len(cycles),
        "cycles_behind": sum(cycle["behind"] for cycle in cycles),
        "cycle_seconds": _summary([cycle["seconds"] for cycle in cycles]),
        "capture_seconds_median": statistics.median(cycle["capture_seconds"] for cycle in cycles),
        "merge_seconds": _summary([cycle["merge_seconds"] for cycle in cycles]),
        "records_per_cycle_median": statistics.median(cycle["records"] for cycle in cycles),
        "upkeep_passes": upkeep_passes,
        "upkeep_pass_seconds": {kind: _summary(held) for kind, held in pass_seconds.items()},
        "sync_cpu_seconds_per_minute": {"python": python_cpu / elapsed_minutes, "jvm_and_workers": jvm_cpu / elapsed_minutes},
        "load_cpu_seconds_per_minute": load.cpu_seconds / ((time.monotonic() - load_started) / 60),
        "peak_pss_mib": {"jvm_and_workers": peak_jvm, "python_with_memory_table": peak_python},
        "peak_jvm_heap_mib": peak_heap,
    }


def _cadenced_cycle(stack: CapacityStack, batch: str, run_cycle_started: float, entry: tuple[SyncRun, TableCadence]) -> tuple[SyncRun, CycleReport]:
    (run, cadence), report, started = entry, None, time.monotonic()
    try:
        stack.resources["spark"].activate_in_this_thread()
        report = run.cycle(batch)
        return run, report
    finally:
        cadence.cycled(run_cycle_started, report, time.monotonic() - started)


def _timed(call: Callable, kind: str, seconds: dict[str, list[float]]) -> Callable:
    """`call`, appending to `seconds[kind]` how long each call took that did something (returned other than None or
    an empty dict: a compaction that found nothing due)."""

    def run(*args, **kwargs):
        started = time.monotonic()
        result = call(*args, **kwargs)
        if result is not None and result != {}:
            seconds[kind].append(time.monotonic() - started)
            print(f"  {kind} pass: {seconds[kind][-1]:.1f} s", flush=True)
        return result

    return run


def drained_and_compared(stack: CapacityStack) -> dict:
    """Drains the stream, then compares the table's keys, read as Athena reads them (PyIceberg, from the table's
    newest metadata, not the Spark session that wrote it), with the items': nothing lost, nothing resurrected."""
    syncer = _syncer(stack, MemoryClients(stack.table, stack.resources["aws"]))
    number = 0
    while stack.table.records_waiting():
        number += 1
        syncer.cycle(f"drain-{number}")
    key = declared("books").spec.key.name
    keys = set(_books_table(stack.settings, stack.env["AWS_ENDPOINT_URL"]).scan(selected_fields=(key,)).to_arrow().column(0).to_pylist())
    return {"rows_at_end": len(keys), "items_at_end": len(stack.table.items), "table_equals_items": keys == set(stack.table.items)}


def run(rate: float, minutes: float, warm_up_minutes: float, interval: float, initial_books: int, summary_bytes: int, shards: int) -> dict:
    with capacity_stack(OUT / "sync-capacity-stack", initial_books, summary_bytes, shards) as stack:
        result = measure(stack, rate, interval, minutes, warm_up_minutes)
        return {**result, "initial_books": initial_books, **drained_and_compared(stack)}


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
