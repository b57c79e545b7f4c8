"""`make bench-cost`: the books sync's monthly bill on AWS, computed from what it does here.

The sync run's own loop (capture, MERGE, commit manifest, checks, compaction and tombstone pruning between cycles,
its writer lease renewed) against a table and stream served from memory (`bench-sync-capacity`), with the warehouse and
the staging on the emulator's S3, so that every S3 request is counted, by the step that made it and the files it
touched. For each rate (writes a second of ~1 KB) and each interval: freshness record by record, CPU, peak memory,
the requests, the Iceberg commits, the bytes stored; then `bill.py` prices them with `prices.py`. Each cell ends
with the pass of an upkeep run (expiry, the run's own task beside the sync's), priced as a task and its requests at
its cadence. `--tables-beside` adds small streamed tables to the
same loop (shaped as reviews, a composite key, written at `--beside-rate` a second each): the bill of books with them,
less books' alone, is the marginal table's. `--copies 10` measures books at ten times its seeded size (10 GB from 1 GB):
Spark copies the bootstrapped rows under new keys, and the memory table holds the copies as they are read.

The sync runs within the task's size (`--vcpu`, `--memory-gb`: a CPU quota and a memory limit, `task_limits.py`); the
emulator and the load generator outside it. `--spark-memory` sets the JVM's heap. `--write-docs` writes docs/cost.md from the results
(docs/cost-cells.json, versioned, keeps every cell measured: a run adds to it, replacing cells measured again, and
`--docs-only` writes the page again from it when the bill or the prices change).

    .venv/bin/python -m ddb_athena_bench.cost --rates 230 --intervals 10,20,30,60,120 --minutes 5 --vcpu 0.5 --memory-gb 3
    .venv/bin/python -m ddb_athena_bench.cost --rates 230 --intervals 30 --minutes 10 --tables-beside 0,3
    .venv/bin/python -m ddb_athena_bench.cost --rates 230 --intervals 20 --minutes 60 --warm-up-minutes 3 --copies 10
"""

import argparse
import collections
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import boto3

from ddb_athena.lake.table_spec import tombstone_table
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.settings import DEFAULT_MERGE_INTERVAL_SECONDS, REPO_ROOT
from ddb_athena.lib.writer_lease import WriterLease
from ddb_athena_bench import bill as billing
from ddb_athena_bench import stage_metrics
from ddb_athena_bench.counting_emulator import PROBE_ACCESS_KEY
from ddb_athena_bench.freshness import OUT, request_counts
from ddb_athena_bench.prices import FREE_TIERS, PRICES, SPOT_SHARE_WORSE
from ddb_athena_bench.sync_capacity import CapacityStack, MemoryClients, TableBeside, capacity_stack, drained_and_compared, measure, small_tables
from ddb_athena_bench.task_limits import TaskLimits
from ddb_athena_bench.volume import _books_table

# The measurements docs/cost.md is computed from, beside it: the page can be computed again when the bill or a price
# changes, without measuring again.
RESULTS = REPO_ROOT / "docs" / "cost-cells.json"
# The smallest task measured to hold the sync at 230 writes a second (0.25 vCPU / 2 GB and 0.5 vCPU / 2 GB were
# killed at their memory limit: docs/performance-log.md); deploy/dagster.yaml gives runs this size.
DEFAULT_TASK = billing.Task(0.5, 3)
# The JVM's heap in that task (deploy/dagster_ecs.yaml sets the same for the runs: DDB_ATHENA_SPARK_DRIVER_MEMORY).
DEFAULT_SPARK_MEMORY = "1536m"
DOCS = REPO_ROOT / "docs" / "cost.md"


class RequestMeter:
    """Counts the emulator's requests by the step of the loop that was running (`between` for none: the lease's
    renewals while the loop sleeps) and the memory stream's calls, with its empty pages."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.by_step: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        # The steps running now, newest last: tables cycling side by side overlap theirs, and the emulator counts for the
        # whole process, so what comes while they overlap is the newest one's.
        self._running: list[str] = []
        self._lock = threading.Lock()
        request_counts(endpoint, reset=True)

    @property
    def _step(self) -> str:
        return self._running[-1] if self._running else "between"

    def _flush(self) -> None:
        self.by_step[self._step].update(request_counts(self.endpoint, reset=True))

    def step(self, name: str, call: Callable) -> Callable:
        def counted(*args, **kwargs):
            with self._lock:
                self._flush()
                self._running.append(name)
            try:
                return call(*args, **kwargs)
            finally:
                with self._lock:
                    self._flush()
                    del self._running[max(index for index, running in enumerate(self._running) if running == name)]

        return counted

    def clients(self, clients: MemoryClients) -> object:
        meter = self

        class Counted:
            def __init__(self, service: str, client):
                self._service, self._client = service, client

            def __getattr__(self, name: str):
                attribute = getattr(self._client, name)
                if not callable(attribute) or self._service not in ("dynamodb", "dynamodbstreams"):
                    return attribute

                def call(*args, **kwargs):
                    response = attribute(*args, **kwargs)
                    operation = "".join(part.title() for part in name.split("_"))
                    with meter._lock:
                        meter.by_step[meter._step][f"{self._service} {operation}"] += 1
                        if name == "get_records" and not response.get("Records"):
                            meter.by_step[meter._step][billing.EMPTY_PAGES] += 1
                    return response

                return call

        class CountedClients:
            def client(self, service: str):
                return Counted(service, clients.client(service))

        return CountedClients()

    def take(self) -> dict[str, dict[str, int]]:
        with self._lock:
            self._flush()
            taken = {step: dict(counts) for step, counts in self.by_step.items()}
            self.by_step.clear()
        return taken


def _stored_bytes(stack: CapacityStack) -> int:
    """Every object in the bucket: the table's live files, those its retained snapshots keep, metadata, staging."""
    s3 = boto3.client(
        "s3", endpoint_url=stack.env["AWS_ENDPOINT_URL"], aws_access_key_id=PROBE_ACCESS_KEY, aws_secret_access_key="probe", region_name=stack.settings.region
    )
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=stack.settings.bucket)
    return sum(item["Size"] for page in pages for item in page.get("Contents", []))


def _commits_between(stack: CapacityStack, tables: list[str], since_ms: int, until_ms: int) -> int:
    """The commits of the streamed tables named and of their tombstones."""
    endpoint = stack.env["AWS_ENDPOINT_URL"]
    return sum(
        sum(1 for snapshot in _books_table(stack.settings, endpoint, name).metadata.snapshots if since_ms <= snapshot.timestamp_ms < until_ms)
        for table in tables
        for name in (table, tombstone_table(table))
    )


def measure_cell(
    stack: CapacityStack,
    limits: TaskLimits,
    lease: WriterLease,
    rate: float,
    interval: float,
    minutes: float,
    warm_up_minutes: float,
    beside: list[TableBeside] = (),
) -> dict:
    """One rate and interval: the measurement `bill.bill` prices. The writer's `lease` held throughout, as a run holds it
    (and each table's beside it, its own)."""
    meter = RequestMeter(stack.env["AWS_ENDPOINT_URL"])
    warm_until = time.time() + warm_up_minutes * 60
    throttled = limits.throttled_seconds()
    instruments = _after(warm_until, meter, limits)
    result = measure(stack, rate, interval, minutes, warm_up_minutes, before_write=lease.check, instruments=instruments, beside=beside)
    result["cpu_throttled_seconds"] = limits.throttled_seconds() - throttled
    requests = meter.take()
    measured_ms = (int(warm_until * 1000), int(time.time() * 1000))
    # The upkeep run's pass, counted apart: its own task, priced at its cadence.
    result["upkeep_run"] = _upkeep_pass(stack, meter)
    sample = list(itertools.islice(stack.table.items.values(), 1000))
    item_bytes = sum(len(json.dumps(item, default=str)) for item in sample) / len(sample)
    return {
        **result,
        "measured_seconds": result["minutes"] * 60,
        "requests_by_step": requests,
        "iceberg_commits": _commits_between(stack, ["books", *(other.table.iceberg_table for other in beside)], *measured_ms),
        "recorded_cycles": result["cycles"],
        "stored_bytes": _stored_bytes(stack),
        "table_bytes": item_bytes * len(stack.table.items),
        "items": len(stack.table.items),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _after(moment: float, meter: RequestMeter, limits: TaskLimits):
    """The meter, counting only from `moment` (the end of the warm-up): what came before is dropped. The load
    generator's thread runs outside the task's CPU quota."""

    class Measured:
        def step(self, name, call):
            counted = meter.step(name, call)

            def run(*args, **kwargs):
                if time.time() < moment:
                    meter.take()
                return counted(*args, **kwargs)

            return run

        def clients(self, clients):
            return meter.clients(clients)

        def load_started(self, thread):
            limits.exempt_thread(thread.native_id)

    return Measured()


def _upkeep_pass(stack: CapacityStack, meter: RequestMeter) -> dict:
    from ddb_athena.lib.upkeep import trim

    meter.take()
    started = time.monotonic()
    meter.step("maintenance", trim)(stack.resources["spark"], stack.resources["sync"], declared("books"), datetime.now(UTC), False)
    return {"seconds": time.monotonic() - started, "requests_by_step": meter.take()}


def cell_bill(cell: dict, capture: str = "run") -> billing.Bill:
    task = billing.Task(cell["vcpu"], cell["memory_gb"])
    measurement = dict(cell)
    # Cells measured before upkeep left the loop carry a maintenance pass as the loop made it (`maintenance_pass`).
    maintenance = cell.get("upkeep_run") or cell.get("maintenance_pass")
    if maintenance:
        # A pass every maintenance interval: its requests, scaled to the window's length.
        per_window = cell["measured_seconds"] / (cell["maintenance_interval_minutes"] * 60)
        steps = {step: dict(counts) for step, counts in cell["requests_by_step"].items()}
        for step, counts in maintenance["requests_by_step"].items():
            for kind, count in counts.items():
                steps.setdefault(step, {})[kind] = steps.get(step, {}).get(kind, 0) + count * per_window
        measurement["requests_by_step"] = steps
    result = billing.bill(measurement, task, capture=capture)
    result.task = task
    return result


def report(cells: list[dict]) -> str:
    lines = [
        "| writes/s | interval s | p95 freshness s (max) | cycles behind | CPU-s a minute (throttled s) | peak PSS MiB, JVM and workers | task "
        "| S3 PUT / GET a cycle "
        f"| USD a month: on demand x86 / Graviton / Spot Graviton / Spot at a {SPOT_SHARE_WORSE:g} share | targets | measured |",
        "| ---: | ---: | --- | ---: | ---: | ---: | --- | --- | --- | --- | --- |",
    ]
    for cell in cells:
        result = cell_bill(cell)
        put, get = _requests_a_cycle(cell)
        cpu = cell["sync_cpu_seconds_per_minute"]
        totals = [result.total(option) for option in result.task_options]
        fresh = cell["freshness_seconds"]
        lines.append(
            f"| {cell['rate']:g} | {cell['interval_seconds']:g} | {fresh['p95']:.1f} ({fresh['max']:.1f}) | {cell['cycles_behind']} of {cell['cycles']} "
            f"| {cpu['python'] + cpu['jvm_and_workers']:.1f} ({cell['cpu_throttled_seconds']:.0f}) | {cell['peak_pss_mib']['jvm_and_workers']:,.0f} "
            f"| {result.task.label} | {put:.1f} / {get:.1f} "
            f"| {' / '.join(f'{usd:.2f}' for usd in totals)} | {billing.against_targets(result, fresh['p95'])} "
            f"| {cell['minutes']:.0f} min, {cell['measured_at'][:10]}, code {cell.get('code', 'unrecorded')}{'; ' + cell['note'] if cell.get('note') else ''} |"
        )
    return "\n".join(lines)


def floors(cells: list[dict]) -> str:
    """Each cell's bill beside its floor (bill.FLOOR_LINES and the task), on Spot and on demand on Graviton, and the
    targets its p95 is within, were the bill its floor."""
    lines = [
        "| writes/s | interval s | task | p95 s | USD a month, Spot / on demand, Graviton | of which the floor | the targets, were the bill its floor |",
        "| ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    options = (billing.SPOT, "on demand, Graviton")
    for cell in cells:
        result = cell_bill(cell)
        p95 = cell["freshness_seconds"]["p95"]
        lines.append(
            f"| {cell['rate']:g} | {cell['interval_seconds']:g} | {result.task.label} | {p95:.1f} "
            f"| {' / '.join(f'{result.total(option):.2f}' for option in options)} "
            f"| {' / '.join(f'{billing.floor_usd(result, option):.2f}' for option in options)} "
            f"| {billing.against_targets(result, p95, billing.floor_usd)} |"
        )
    return "\n".join(lines)


def marginal(cells: list[dict]) -> str:
    """Each cell with small tables beside books against books alone at the same rate, interval and task: the bill of a
    further streamed table in the same run (its commits, stream reads, checks, upkeep and lease; the task is shared)."""
    alone = {_cell_key(cell)[:4]: cell for cell in cells if billing.streamed_tables(cell) == 1}
    lines = [
        "| books writes/s | interval s | task | tables beside (writes/s each, their interval s) | p95 freshness of books s: alone / with them "
        "| S3 PUT / GET a cycle: alone / with them | USD a month, Graviton on demand: alone / with them | **each table beside** | measured |",
        "| ---: | ---: | --- | --- | --- | --- | --- | ---: | --- |",
    ]
    for cell in cells:
        base = alone.get(_cell_key(cell)[:4])
        beside = cell.get("tables_beside", [])
        if not beside or base is None:
            continue
        option = "on demand, Graviton"
        first, more = cell_bill(base).total(option), cell_bill(cell).total(option)
        requests = [_requests_a_cycle(measured) for measured in (base, cell)]
        beside_interval = beside[0].get("interval_seconds", cell["interval_seconds"])
        lines.append(
            f"| {cell['rate']:g} | {cell['interval_seconds']:g} | {cell_bill(cell).task.label} | {len(beside)} ({beside[0]['rate']:g}, {beside_interval:g}) "
            f"| {base['freshness_seconds']['p95']:.1f} / {cell['freshness_seconds']['p95']:.1f} "
            f"| {requests[0][0]:.1f} / {requests[0][1]:.1f}, {requests[1][0]:.1f} / {requests[1][1]:.1f} "
            f"| {first:.2f} / {more:.2f} | **{(more - first) / len(beside):.2f}** | {cell['minutes']:.0f} min each, {cell['measured_at'][:10]} |"
        )
    return "\n".join(lines)


def _requests_a_cycle(cell: dict) -> tuple[float, float]:
    billed, _ = billing.price_requests(cell["requests_by_step"])
    cycles = max(cell["cycles"], 1)
    return tuple(sum(count for (_, kind), count in billed.items() if kind == kind_class) / cycles for kind_class in ("PUT", "GET"))


def line_items(cell: dict) -> str:
    result = cell_bill(cell)
    lambda_bill = cell_bill(cell, capture="lambda")
    rows = ["| line | USD a month | of which an always-free allowance would cover | made of |", "| --- | ---: | ---: | --- |"]
    handovers = f"730 hours, and {billing.HANDOVER_OVERLAP_SECONDS:.0f} s an hour beside the next run's task at the handover"
    rows += [f"| task {result.task.label}, {option} | {usd:.2f} | | {handovers} |" for option, usd in result.task_options.items()]
    rows += _lines_rows(result.lines)
    rows.append(f"| **all but the task** | **{result.without_task:.2f}** | {sum(billing.free_column(result.lines)):.2f} | |")
    lambda_how = "the Lambda's invocations and files, the cleanup runs' tasks; no Streams reads, no checkpoints"
    lambda_free = sum(billing.free_column(lambda_bill.lines))
    rows.append(f"| with the capture Lambda instead, all but the task | {lambda_bill.without_task:.2f} | {lambda_free:.2f} | {lambda_how} |")
    differs = ", ".join(f"{line} {count:,.0f}" for line, count in sorted(result.not_on_aws.items()))
    rows.append(f"| requests made here and not on AWS, a month (not billed) | | | {differs or 'none'} |")
    return "\n".join(rows)


def _lines_rows(lines: list[billing.Line]) -> list[str]:
    return [
        f"| {line.name} | {line.usd:.2f} | {f'{free:.2f}' if free else ''} | {line.how} |" for line, free in zip(lines, billing.free_column(lines), strict=True)
    ]


def _platform_table() -> str:
    lines = billing.platform_bill()
    rows = ["| line | USD a month | of which an always-free allowance would cover | made of |", "| --- | ---: | ---: | --- |", *_lines_rows(lines)]
    rows.append(f"| **platform** | **{sum(line.usd for line in lines):.2f}** | {sum(billing.free_column(lines)):.2f} | |")
    return "\n".join(rows)


def everything(cell: dict) -> str:
    """The deployment's whole bill on its defaults: books' line (the cell) and the platform, on Spot, at a worse
    share, on demand."""
    result, platform = cell_bill(cell), sum(line.usd for line in billing.platform_bill())
    rows = ["| the sync's task on | books' line | the platform | **the deployment** |", "| --- | ---: | ---: | ---: |"]
    for option in (billing.SPOT, billing.SPOT_WORSE, "on demand, Graviton"):
        rows.append(f"| {option} | {result.total(option):.2f} | {platform:.2f} | **{result.total(option) + platform:.2f}** |")
    return "\n".join(rows)


def _network_table(cell: dict) -> str:
    lines = billing.nat_alternative(cell, billing.SYNC_TASK_HOURS)
    rows = ["| line | USD a month | made of |", "| --- | ---: | --- |"]
    rows += [f"| {line.name} | {line.usd:.2f} | {line.how} |" for line in lines]
    rows.append(f"| **private subnets instead: the difference** | **{sum(line.usd for line in lines):+.2f}** | |")
    return "\n".join(rows)


def _price_table() -> str:
    rows = ["| price | USD | unit | source | as of |", "| --- | ---: | --- | --- | --- |"]
    rows += [f"| `{name}` | {item.usd:.10g} | {item.unit} | {item.source} | {item.as_of} |" for name, item in PRICES.items()]
    return "\n".join(rows)


def docs(cells: list[dict]) -> str:
    by_rate = sorted(cells, key=lambda cell: (cell["rate"], cell["interval_seconds"]))
    # Line by line: the default interval's cell if measured, at the highest rate; then the newest.
    detailed = max(by_rate, key=lambda cell: (cell["interval_seconds"] == DEFAULT_MERGE_INTERVAL_SECONDS, cell["rate"], cell["measured_at"]))
    return "\n".join(
        [
            "# What the books sync costs on AWS",
            "",
            "<!-- Generated by `make bench-cost WRITE_DOCS=1` (ddb_athena_bench/cost.py) from docs/cost-cells.json; do not edit. -->",
            "",
            "Every figure below is computed by `ddb_athena_bench/bill.py` from a measurement of the sync run's own loop "
            "(`make bench-cost`: the books table and stream served from memory, the warehouse and the staging on the "
            "emulator's S3, every request counted by the step that made it) and the price table `ddb_athena_bench/prices.py`. "
            "us-east-1, 730 hours a month; always-free allowances in a column of their own, never taken off a total.",
            "",
            "## The dial: writes a second, interval, freshness, dollars",
            "",
            report(by_rate),
            "",
            "Task: the size the cell ran within (a CPU quota and a memory limit, as ECS sets them; the JVM and Spark's workers "
            "within the task's memory less 0.5 GB for the run worker's Python). Spot: the deployment's default capacity, at the "
            f"share in the price table and at {SPOT_SHARE_WORSE:g}. Targets, the project's goals for books' own line on Graviton (the "
            "requirement asks for a minute or two): " + "; ".join(target.label for target in billing.TARGETS) + ".",
            "",
            "## The floor: what no tuning of upkeep, checks or the lease goes under",
            "",
            floors(by_rate),
            "",
            "The floor is the task and its address, the commits (the MERGE's files and manifests, the tombstones', the "
            "writer fence's publications) with their Glue requests, the stream's reads, the table's storage and the daily "
            "parity scan, as "
            "measured in the cell: what a cycle costs while per-key order, deletes that never resurrect and one fenced writer "
            "hold. Where the floor alone is over the target, no cut of the other lines reaches it at that interval and task.",
            "",
            f"## Line by line: {detailed['rate']:g} writes a second, a cycle every {detailed['interval_seconds']:g} s"
            + (" (the default)" if detailed["interval_seconds"] == DEFAULT_MERGE_INTERVAL_SECONDS else ""),
            "",
            line_items(detailed),
            "",
            "Requests made here and not on AWS are those of Hadoop's catalog and S3A on the warehouse (directory markers, the "
            "version hint, a commit's metadata renamed, probes and listings): a deployment's Glue catalog and S3FileIO make "
            "none of them. Glue's requests are priced from the commits counted (the emulator's warehouse has no Glue catalog). "
            "The capture Lambda's line is modelled from the template (one invocation per shard per batching window).",
            "",
            "## A further table in the same run",
            "",
            marginal(by_rate),
            "",
            "Tables beside books: small streamed tables shaped as `reviews` (a composite key), each written at the rate shown, "
            "synced in the same run and JVM after books each cycle (`--tables-beside`). Each brings its own commits (its table "
            "and tombstones, the fence's publication), stream reads, checks, upkeep and lease; the task is the one books uses.",
            "",
            "## The platform, shared by every table",
            "",
            _platform_table(),
            "",
            "## Everything the deployment runs",
            "",
            everything(detailed),
            "",
            "Books' line is the cell above (each table declared beside it adds its marginal line). What the schedules and "
            "sensors start, and where its tasks are priced (freshness checks and alerts are the daemon's sensors: no run, no task):",
            "",
            "| runs of | priced |",
            "| --- | --- |",
            *(f"| `*{ending}` | {line} |" for ending, line in billing.PRICED_RUNS.items()),
            "",
            "## The network: public subnets, or a NAT gateway",
            "",
            "The template deploys every task in public subnets with an address of its own (`AssignPublicIp=ENABLED`, the "
            "runbook's shape: priced above). Private subnets need a NAT gateway for what has no gateway endpoint (DynamoDB "
            "Streams, Glue, ECR's API, CloudWatch); the S3 and DynamoDB gateway endpoints, which the template creates, keep "
            "the commits and the scans off it:",
            "",
            _network_table(detailed),
            "",
            "Orders (the daily export and its load) and the alternatives (Firehose, Glue zero-ETL, Athena's own MERGE): "
            "[cost-orders-and-alternatives.md](cost-orders-and-alternatives.md).",
            "",
            "## Prices",
            "",
            _price_table(),
            "",
            "Always-free allowances, a month and an account (shown in their column, never taken off a total): "
            + "; ".join(description for _, description in FREE_TIERS.values())
            + ".",
            "",
        ]
    )


def _code_version() -> str:
    """The commit measured, marked when tracked files differ from it (but for what the bench itself writes)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    own = [f":(exclude){path.relative_to(REPO_ROOT)}" for path in (RESULTS, DOCS)]
    status = ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *own]
    changed = subprocess.run(status, cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    return f"{head}{' with changes' if changed else ''}" if head else "unknown"


def _lease(stack: CapacityStack, table: str) -> WriterLease:
    """The writer lease of `table`, taken as a sync run takes it (renewed by its checks before each write)."""
    sync = stack.resources["sync"]
    lease = WriterLease(stack.resources["aws"].client("s3"), sync.bucket, table, "bench-cost", stack.settings.writer_lease_seconds)
    lease.acquire()
    return lease


def _cell_key(cell: dict) -> tuple:
    return cell["rate"], cell["interval_seconds"], cell["vcpu"], cell["memory_gb"], billing.streamed_tables(cell), cell.get("copies", 1)


def _load() -> list[dict]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1,10,100,230", help="writes a second, comma-separated")
    parser.add_argument("--intervals", default="10,20,30,60,120", help="seconds between cycles, comma-separated")
    parser.add_argument("--minutes", type=float, default=30.0, help="measured per cell after its warm-up (at least 10 cycles); 60 holds every pass of an hour")
    parser.add_argument("--warm-up-minutes", type=float, default=1.0)
    parser.add_argument("--initial-books", type=int, default=1_000_000, help="1 GB of ~1 KB items")
    parser.add_argument("--summary-bytes", type=int, default=700)
    parser.add_argument(
        "--copies", type=int, default=1, help="books grown by Spark after its bootstrap to this many copies of each item (10 with 1,000,000: 10 GB)"
    )
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--vcpu", type=float, default=DEFAULT_TASK.vcpu, help="the task's vCPU: the sync's CPU quota")
    parser.add_argument("--memory-gb", type=float, default=DEFAULT_TASK.memory_gb, help="the task's memory")
    parser.add_argument("--spark-memory", default=DEFAULT_SPARK_MEMORY, help="the JVM's heap (spark.driver.memory)")
    parser.add_argument("--tables-beside", default="0", help="small streamed tables synced beside books, comma-separated counts (0,3: alone, then with three)")
    parser.add_argument("--beside-rate", type=float, default=2.0, help="writes a second to each table beside books")
    parser.add_argument(
        "--beside-interval", type=float, default=None, help="each table beside books declared with this merge_interval_seconds (default: the run's)"
    )
    parser.add_argument(
        "--spark-event-log", action="store_true", help="keep Spark's event log and print each cell's statements by stage metrics (stage_metrics.py)"
    )
    parser.add_argument("--write-docs", action="store_true", help="write docs/cost.md from every cell measured so far")
    parser.add_argument("--docs-only", action="store_true", help="measure nothing: write docs/cost.md from the saved cells")
    arguments = parser.parse_args(argv)
    cells = _load()
    if not arguments.docs_only:
        rates = [float(rate) for rate in arguments.rates.split(",")]
        intervals = [float(interval) for interval in arguments.intervals.split(",")]
        scratch = OUT / "cost-stack"
        billing.Task(arguments.vcpu, arguments.memory_gb)  # a size Fargate offers, before an hour is spent on it
        # A group of its own: a second cell on the host would otherwise share this one's quota and memory (both were
        # killed at once, the JVMs of two bootstraps within one 2.5 GB limit).
        limits = TaskLimits(f"ddb_athena_bench_{os.getpid()}", arguments.vcpu, arguments.memory_gb)
        stack_options = {"warehouse_on_s3": True, "spark_memory": arguments.spark_memory, "limits": limits, "copies": arguments.copies}
        event_log = OUT / "stage-events" if arguments.spark_event_log else None
        stack_options["event_log"] = event_log
        with capacity_stack(scratch, arguments.initial_books, arguments.summary_bytes, arguments.shards, **stack_options) as stack:
            limits.release_this_process_memory()
            sync = stack.resources["sync"]
            lease = _lease(stack, sync.iceberg_table_of(declared("books")))
            created = 0
            for count, rate, interval in [(int(n), r, i) for n in arguments.tables_beside.split(",") for r in rates for i in intervals]:
                # Each cell's tables beside books are new ones, each with its lease, synced from their first write.
                tables = small_tables(created + count, arguments.beside_interval)[created:]
                created += count
                beside = [TableBeside(table, arguments.beside_rate, _lease(stack, sync.iceberg_table_of(table)).check) for table in tables]
                minutes = max(arguments.minutes, 10 * interval / 60)
                print(f"--- {rate:g} writes/s, a cycle every {interval:g} s, {count} tables beside, {minutes:g} minutes measured", flush=True)
                measured_from = time.time() + arguments.warm_up_minutes * 60
                cell = measure_cell(stack, limits, lease, rate, interval, minutes, arguments.warm_up_minutes, beside)
                if event_log is not None:
                    application = stack.resources["spark"].spark_session.sparkContext.applicationId
                    (log,) = event_log.glob(f"{application}*")
                    print(stage_metrics.table(stage_metrics.summary(stage_metrics.read(log), int(measured_from * 1000))), flush=True)
                cell.update(
                    code=_code_version(),
                    vcpu=arguments.vcpu,
                    memory_gb=arguments.memory_gb,
                    spark_memory=arguments.spark_memory,
                    maintenance_interval_minutes=stack.resources["sync"].maintenance_interval_minutes,
                    copies=arguments.copies,
                )
                if arguments.copies > 1:
                    cell["note"] = f"books {cell['items'] / 1e6:.1f} M items, {cell['table_bytes'] / 1e9:.1f} GB (copied by Spark)"
                cells = [old for old in cells if _cell_key(old) != _cell_key(cell)] + [cell]
                RESULTS.write_text(json.dumps(cells, indent=2))
                print(report([cell]), flush=True)
            lease.release()
            cells[-1].update(drained_and_compared(stack))
            RESULTS.write_text(json.dumps(cells, indent=2))
            print(f"drained: {cells[-1]['rows_at_end']:,} rows, {cells[-1]['items_at_end']:,} items, same keys: {cells[-1]['table_equals_items']}")
    print(report(cells))
    print(marginal(cells))
    if arguments.write_docs or arguments.docs_only:
        DOCS.write_text(docs(cells))
        print(f"wrote {DOCS.relative_to(Path.cwd()) if DOCS.is_relative_to(Path.cwd()) else DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
