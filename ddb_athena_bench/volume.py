"""`make bench-volume`: the real local stack under load, stepped up to the requirement's rate and held there.

What `make dev` starts (the emulator, `dagster dev` with its daemon, schedules and sensors), in a scratch
directory, the warehouse on the emulator's S3 (through S3A), so that every request the deployment makes is counted
by the emulator (`counting_emulator`). A load generator (`load`: several processes of inserts, updates, deletes and
re-inserts of ~1 KB books) writes at each step's rate; after a warm-up at that rate, for the step's minutes:

- freshness: a marker item every few seconds, polled in library.books with PyIceberg (from the table's metadata, as
  Athena reads it) until it is there: p50 / p95 / max;
- the sync run's CPU-seconds a minute and peak memory (PSS of its run worker, JVM and Spark's Python workers; the
  largest single run, when one replaces another), the JVM's heap
  in use (`jstat`), the emulator's and the load generator's CPU (to tell who could not keep up);
- the writes the load generator achieved, the sync's cycles, merges, change files and records a minute, the cycles
  whose capture stopped behind the stream, and the Iceberg commits a minute (both tables, from their metadata);
- the requests the whole deployment made to S3 (by price class), DynamoDB and its Streams, a minute and per commit
  (the probe's own reads are made under another access key and left out).

Writes a Markdown report and a PNG chart of the cost drivers against the write rate to .ddb_athena/bench/.

    .venv/bin/python -m ddb_athena_bench.volume --steps 1,10,50,100,250 --step-minutes 5 --hold-minutes 60
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import psutil

from ddb_athena.lib.resources import sync_settings
from ddb_athena.lib.settings import Settings
from ddb_athena_bench.counting_emulator import PROBE_ACCESS_KEY
from ddb_athena_bench.freshness import OUT, CpuMeter, Markers, _percentile, _run_workers, _start, _stop, local_stack, request_counts

PROBE_EVERY_SECONDS = 5.0
SAMPLE_SECONDS = 5.0
WARM_UP_SECONDS = 90.0
LOAD_OPERATIONS = ("dynamodb PutItem", "dynamodb UpdateItem", "dynamodb DeleteItem")
# The emulator serves requests one at a time under Python's lock: near this many CPU-seconds a minute it is the bottleneck.
EMULATOR_SATURATED_CPU = 40.0
# What S3 bills at the GET rate; every other request is billed at the PUT rate (LIST, COPY, DELETE is free but rare).
S3_GET_CLASS = ("GetObject", "HeadObject")


def _load_command(rate: float, processes: int) -> list[str]:
    return [sys.executable, "-m", "ddb_athena_bench.load", "--rate", str(rate), "--processes", str(processes)]


def _books_table(settings: Settings, endpoint: str, name: str = "books"):
    """library.books (or its tombstones), as PyIceberg reads it from its newest metadata on the emulator's S3."""
    from pyiceberg.table import StaticTable

    if not settings.warehouse.startswith("s3a://"):  # a local warehouse (`--warehouse local`)
        return StaticTable.from_metadata(f"{urlparse(settings.warehouse).path}/{settings.namespace}/{name}")
    location = f"{settings.warehouse.replace('s3a://', 's3://')}/{settings.namespace}/{name}"
    properties = {"s3.endpoint": endpoint, "s3.access-key-id": PROBE_ACCESS_KEY, "s3.secret-access-key": "probe", "s3.region": settings.region}
    return StaticTable.from_metadata(location, properties=properties)


def _visible(table, wanted: set[str]) -> set[str]:
    from pyiceberg.expressions import In

    rows = table.scan(row_filter=In("id", tuple(wanted)), selected_fields=("id",)).to_arrow()
    return set(rows.column("id").to_pylist())


def _commits(settings: Settings, endpoint: str, since_ms: int, until_ms: int) -> int:
    """Snapshots committed to library.books and its tombstones in the window (compactions included)."""
    return sum(
        sum(1 for snapshot in _books_table(settings, endpoint, name).metadata.snapshots if since_ms <= snapshot.timestamp_ms < until_ms)
        for name in ("books", "books_tombstones")
    )


def _cycles(dagster_home: Path, since: float, until: float) -> dict:
    """What the sync's cycles reported in the window (books_source's and books_iceberg's materializations)."""
    from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

    found: dict[str, list[dict]] = {}
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        for asset in ("books_source", "books_iceberg"):
            records, cursor = [], None
            while True:
                page = instance.fetch_materializations(
                    AssetRecordsFilter(asset_key=AssetKey(asset), after_timestamp=since, before_timestamp=until), limit=1000, cursor=cursor
                )
                records += page.records
                if not page.has_more:
                    break
                cursor = page.cursor
            found[asset] = [{key: value.value for key, value in record.asset_materialization.metadata.items()} for record in records]
    sources, merges = found["books_source"], found["books_iceberg"]
    return {
        "cycles": len(sources),
        "merges": sum(1 for merge in merges if not merge.get("idle")),
        "change_files": sum(source.get("change_files_written", 0) for source in sources),
        "records_captured": sum(source.get("records_captured", 0) for source in sources),
        "cycles_behind": sum(1 for source in sources if source.get("stream_caught_up") is False),
    }


def _sync_tree(dagster_home: Path, meter: CpuMeter) -> set[int]:
    workers = _run_workers(dagster_home).get("books_sync", set())
    return meter.descendants("dagster", workers & meter.last["dagster"].keys())


def _sync_runs_memory(dagster_home: Path, meter: CpuMeter) -> tuple[float, float | None]:
    """The largest memory of one sync run (its worker's process tree: `_memory`): when a run is replaced, the one
    ending and the one starting are two runs, each sized on its own."""
    workers = _run_workers(dagster_home).get("books_sync", set()) & meter.last["dagster"].keys()
    sizes = [_memory(meter.descendants("dagster", {worker})) for worker in workers]
    return max((rss for rss, _ in sizes), default=0.0), max((heap for _, heap in sizes if heap is not None), default=None)


def _memory(pids: set[int]) -> tuple[float, float | None]:
    """Memory of the live processes among `pids` (MiB): the sum of their proportional set sizes (a page a forked
    Python worker shares with its parent counted once, not in each), and the JVM's heap in use (MiB, `jstat -gc`), if
    one is among them."""
    rss, heap = 0.0, None
    for pid in pids:
        try:
            process = psutil.Process(pid)
            rss += process.memory_full_info().pss / 2**20
            if process.name() == "java":
                lines = subprocess.run(["jstat", "-gc", str(pid)], capture_output=True, text=True).stdout.split("\n")
                columns = dict(zip(lines[0].split(), lines[1].split(), strict=False))
                heap = sum(float(columns[name]) for name in ("S0U", "S1U", "EU", "OU")) / 1024
        except (psutil.NoSuchProcess, IndexError, KeyError, ValueError):
            continue
    return rss, heap


def _measure(settings: Settings, env: dict, processes: dict, rate: float, minutes: float, dagster_home: Path) -> dict:
    endpoint = env["AWS_ENDPOINT_URL"]
    dynamodb = settings.client("dynamodb")
    meter = CpuMeter({name: process.pid for name, process in processes.items()})
    before = request_counts(endpoint)
    started, started_at = time.monotonic(), time.time()
    markers = Markers(dynamodb, settings.dynamodb_tables["books"])
    peak_memory, heaps = 0.0, []
    next_probe = next_sample = started
    at_end = None
    end = started + minutes * 60
    # Markers still unseen at the end get the warm-up of the next step to arrive (counted as missing after that).
    while time.monotonic() < end or (markers.pending and time.monotonic() < end + WARM_UP_SECONDS):
        now = time.monotonic()
        if now >= next_probe and now < end:
            markers.write(f"probe-{int(rate)}-{len(markers.written):04d}")
            next_probe += PROBE_EVERY_SECONDS
        try:
            markers.look(lambda wanted: _visible(_books_table(settings, endpoint), wanted))
        except Exception as error:  # the table's metadata between two writes of a commit: try again
            print(f"probe: {type(error).__name__}", flush=True)
        meter.sample()
        if now >= next_sample and now < end:
            rss, heap = _sync_runs_memory(dagster_home, meter)
            peak_memory = max(peak_memory, rss)
            heaps += [heap] if heap is not None else []
            next_sample += SAMPLE_SECONDS
        if now >= end and at_end is None:
            at_end = (meter.snapshot(), request_counts(endpoint), time.time())
        time.sleep(0.5)
    at_end = at_end or (meter.snapshot(), request_counts(endpoint), time.time())
    cpu_at_end, counts_at_end, ended_at = at_end
    elapsed = (ended_at - started_at) / 60
    requests = collections.Counter(counts_at_end)
    requests.subtract(before)
    sync_pids = _sync_tree(dagster_home, meter)
    lags = markers.lags()
    load_writes = sum(requests[operation] for operation in LOAD_OPERATIONS) - len(markers.written)
    commits = _commits(settings, endpoint, int(started_at * 1000), int(ended_at * 1000))
    by_kind = collections.Counter()
    for operation, count in requests.items():
        service, action = operation.split()[:2]
        if service == "probe" or operation in LOAD_OPERATIONS:
            continue
        kind = f"S3 {'GET' if action in S3_GET_CLASS else 'PUT'}-class" if service == "s3" else service
        by_kind[kind] += count
    return {
        "rate": rate,
        "minutes": elapsed,
        "achieved_rate": load_writes / (elapsed * 60),
        "markers": len(markers.written),
        "missing": len(markers.pending),
        "p50": statistics.median(lags) if lags else None,
        "p95": _percentile(lags, 0.95) if lags else None,
        "max": max(lags) if lags else None,
        "sync_cpu": meter.used("dagster", sync_pids, at=cpu_at_end) / elapsed,
        "dagster_cpu": meter.used("dagster", at=cpu_at_end) / elapsed,
        "emulator_cpu": meter.used("emulator", at=cpu_at_end) / elapsed,
        "load_cpu": meter.used("simulator", at=cpu_at_end) / elapsed,
        "peak_memory_mib": peak_memory,
        "heap_mib_max": max(heaps, default=None),
        "commits_per_minute": commits / elapsed,
        "requests_per_minute": {kind: count / elapsed for kind, count in by_kind.items()},
        "requests_per_commit": {kind: count / commits for kind, count in by_kind.items()} if commits else {},
        "requests": {operation: count for operation, count in requests.items() if count},
        **{key: value / elapsed for key, value in _cycles(dagster_home, started_at, ended_at).items()},
    }


def run(steps: list[float], step_minutes: float, hold_minutes: float, processes: int, warehouse_on_s3: bool = True) -> list[dict]:
    scratch = OUT / "volume-stack"
    plan = [(rate, step_minutes) for rate in steps] + ([(steps[-1], hold_minutes)] if hold_minutes else [])
    results = []
    with local_stack(scratch, rate=steps[0], warehouse_on_s3=warehouse_on_s3, simulator=_load_command(steps[0], processes)) as (env, running):
        settings = Settings.from_env(env)
        print("waiting for the first sync to bootstrap library.books ...", flush=True)
        deadline = time.monotonic() + 600
        while True:
            try:
                _books_table(settings, env["AWS_ENDPOINT_URL"])
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError("library.books did not appear within 10 minutes; see " + str(scratch / "dagster.log")) from None
                time.sleep(5)
        current = steps[0]
        for rate, minutes in plan:
            if rate != current:
                _stop(running["simulator"])
                running["simulator"] = _start(_load_command(rate, processes), env, scratch / f"load-{rate:g}.log")
                current = rate
            print(f"{rate:g} writes/s: warming up for {WARM_UP_SECONDS:.0f} s, then measuring for {minutes:g} minutes ...", flush=True)
            time.sleep(WARM_UP_SECONDS)
            result = _measure(settings, env, running, rate, minutes, scratch / "dagster_home")
            results.append(result)
            print(_row(result), flush=True)
    return results


def _figure(value: float | None, form: str = "{:.1f}") -> str:
    return "n/a" if value is None else form.format(value)


COLUMNS = (
    "target writes/s",
    "achieved writes/s",
    "minutes",
    "freshness p50 / p95 / max (s)",
    "markers unseen",
    "sync CPU-s/min",
    "sync run peak memory (MiB)",
    "JVM heap used, max (MiB)",
    "emulator CPU-s/min",
    "load CPU-s/min",
    "cycles/min",
    "merges/min",
    "cycles behind the stream/min",
    "change files/min",
    "commits/min",
    "S3 PUT-class per commit",
    "S3 GET-class per commit",
    "DynamoDB (Streams incl.) per commit",
    "what held it back",
)


def bottleneck(result: dict) -> str:
    """Who could not keep up at this step: the writes (the load generator or the emulator's write path), the sync's
    capture (behind the stream), and whether the emulator or the sync's own CPU stood in its way."""
    findings = []
    if result["achieved_rate"] < 0.9 * result["rate"]:
        who = "the emulator" if result["emulator_cpu"] >= EMULATOR_SATURATED_CPU else "the load generator"
        findings.append(f"writes: {result['achieved_rate']:.0f} of {result['rate']:g}/s ({who})")
    if result["cycles_behind"]:
        if result["emulator_cpu"] >= EMULATOR_SATURATED_CPU:
            findings.append(f"capture behind: the emulator ({result['emulator_cpu']:.0f} CPU-s/min) serves its stream and S3")
        elif result["sync_cpu"] >= 50:
            findings.append(f"capture behind: the sync ({result['sync_cpu']:.0f} CPU-s/min)")
        else:
            findings.append("capture behind")
    return "; ".join(findings) or "nothing: kept up"


def _row(result: dict) -> str:
    per_commit = result["requests_per_commit"]
    freshness = " / ".join(_figure(result[key]) for key in ("p50", "p95", "max"))
    cells = (
        f"{result['rate']:g}",
        f"{result['achieved_rate']:.0f}",
        f"{result['minutes']:.0f}",
        freshness,
        f"{result['missing']} of {result['markers']}",
        f"{result['sync_cpu']:.1f}",
        f"{result['peak_memory_mib']:.0f}",
        _figure(result["heap_mib_max"], "{:.0f}"),
        f"{result['emulator_cpu']:.1f}",
        f"{result['load_cpu']:.1f}",
        f"{result['cycles']:.1f}",
        f"{result['merges']:.1f}",
        f"{result['cycles_behind']:.1f}",
        f"{result['change_files']:.1f}",
        f"{result['commits_per_minute']:.1f}",
        _figure(per_commit.get("S3 PUT-class")),
        _figure(per_commit.get("S3 GET-class")),
        _figure(per_commit.get("dynamodb", 0) + per_commit.get("dynamodbstreams", 0)),
        bottleneck(result),
    )
    return "| " + " | ".join(cells) + " |"


def _chart(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    steps = sorted((result for result in results if result["minutes"] > 0), key=lambda result: result["achieved_rate"])
    rates = [result["achieved_rate"] for result in steps]
    figure, (requests_axes, cpu_axes) = pyplot.subplots(1, 2, figsize=(11, 4))
    for kind in ("S3 PUT-class", "S3 GET-class"):
        requests_axes.plot(rates, [result["requests_per_minute"].get(kind, 0) for result in steps], marker="o", label=f"{kind} a minute")
    requests_axes.plot(rates, [result["commits_per_minute"] for result in steps], marker="s", label="Iceberg commits a minute")
    requests_axes.set_xlabel("writes a second achieved")
    requests_axes.set_yscale("log")
    requests_axes.set_title("Requests (the S3 bill) against the write rate")
    requests_axes.legend(fontsize=8)
    cpu_axes.plot(rates, [result["sync_cpu"] for result in steps], marker="o", label="sync run, CPU-s a minute")
    # A step whose markers never showed has no p95: left out, not drawn as 0.
    seen = [result for result in steps if result["p95"] is not None]
    cpu_axes.plot([result["achieved_rate"] for result in seen], [result["p95"] for result in seen], marker="^", label="freshness p95, s")
    cpu_axes.axhline(30, color="grey", linestyle=":", label="p95 target, 30 s")
    cpu_axes.set_xlabel("writes a second achieved")
    cpu_axes.set_title("The task's size and the freshness against the write rate")
    cpu_axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def report(results: list[dict], processes: int, warehouse_on_s3: bool) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    settings = Settings.from_env()
    where = "on the emulator's S3" if warehouse_on_s3 else "in a local directory (Iceberg's own file requests not counted)"
    return "\n".join(
        [
            f"# The sync under load ({when})",
            "",
            f"`make bench-volume`: the local stack, warehouse {where}, a merge every {sync_settings(settings).merge_interval_seconds:g} s, "
            f"the load from {processes} processes of ~1 KB books (40% inserts, 35% updates, 17% deletes, 8% re-inserts), "
            f"a warm-up of {WARM_UP_SECONDS:.0f} s at each rate before it is measured; {os.cpu_count()} cores. Requests are those of the "
            "whole deployment (sync, checks, sensors, cleanup), as the emulator counted them; per commit: over the Iceberg "
            "commits of both tables in the window.",
            "",
            "| " + " | ".join(COLUMNS) + " |",
            "| " + " | ".join("---" for _ in COLUMNS) + " |",
            *(_row(result) for result in results),
            "",
            "![cost drivers against the write rate](volume.png)",
            "",
            "Requests by operation, a minute (the probe's and the load's own left out):",
            "",
            *(
                f"- {result['rate']:g} writes/s: "
                + ", ".join(
                    f"{operation} {count / result['minutes']:.0f}"
                    for operation, count in sorted(result["requests"].items(), key=lambda item: -item[1])
                    if not operation.startswith("probe") and operation not in LOAD_OPERATIONS and count / result["minutes"] >= 1
                )
                for result in results
            ),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1,10,50,100,250", help="write rates, comma-separated")
    parser.add_argument("--step-minutes", type=float, default=5.0)
    parser.add_argument("--hold-minutes", type=float, default=60.0, help="then this long at the last rate (0: not)")
    parser.add_argument("--processes", type=int, default=4, help="load generator processes")
    parser.add_argument(
        "--warehouse",
        choices=("emulator", "local"),
        default="emulator",
        help="emulator: on the emulator's S3, every request counted; local: a directory, the sync's pace without the "
        "emulator serving Iceberg's files (its requests to them are then not counted)",
    )
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    results = run([float(rate) for rate in args.steps.split(",")], args.step_minutes, args.hold_minutes, args.processes, args.warehouse == "emulator")
    _chart(results, OUT / "volume.png")
    text = report(results, args.processes, args.warehouse == "emulator")
    (OUT / "volume.md").write_text(text)
    # The figures themselves, to draw or compare later.
    (OUT / "volume.json").write_text(json.dumps(results, indent=1))
    print(text)
    print(f"report: {OUT / 'volume.md'}, chart: {OUT / 'volume.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
