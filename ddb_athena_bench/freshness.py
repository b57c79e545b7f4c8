"""`make bench-freshness`: how long a DynamoDB write takes to be readable in library.books, on the real local stack.

Starts what `make dev` starts, in a scratch directory (the emulator, a fresh DAGSTER_HOME, `dagster dev`
with its daemon, schedules and sensors, the simulator at 1 write/s), waits for the first sync to
bootstrap, then writes a marker item every ~11 s and polls library.books with PyIceberg (reading the
table from its metadata, as Athena does: not the project's Spark) until each marker is there. Reports
the lag's p50/p95/max, the CPU-seconds per minute of the sync run and of the whole stack, and the
table's data and metadata file counts at both ends; writes a Markdown report and a PNG of the lag
distribution under .ddb_athena/bench/.

    .venv/bin/python -m ddb_athena_bench.freshness [--minutes 30] [--rate 1]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psutil

from ddb_athena.dev.launch import yesterday_utc
from ddb_athena.dev.local_stack import wait_for_endpoint
from ddb_athena.lib.resources import sync_settings
from ddb_athena.lib.settings import LOCAL_STATE_DIR, REPO_ROOT, Settings
from ddb_athena_bench.counting_emulator import COUNTS_PATH
from ddb_athena_bench.delayed_location import DELAY_VARIABLE

OUT = LOCAL_STATE_DIR / "bench"
PROBE_EVERY_SECONDS = 11.0
POLL_SECONDS = 1.0
# File counts and CPU are also recorded this often: whether they level off shows only over time.
SERIES_EVERY_SECONDS = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    # A session of its own: the whole tree can be stopped at the end, whatever signals the caller ignores.
    return subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tree(root_pid: int) -> dict[int, tuple[float, int]]:
    """Own CPU seconds and parent of every live process in the tree."""
    try:
        root = psutil.Process(root_pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for process in processes:
        try:
            times = process.cpu_times()
            found[process.pid] = (times.user + times.system, process.ppid())
        except psutil.NoSuchProcess:
            continue
    return found


class CpuMeter:
    """CPU of process trees over a window, sampled often. A process that ends keeps the CPU of its last sample
    (a run worker ends every hour: its parent need not reap it, so its children-times cannot be relied on)."""

    def __init__(self, roots: dict[str, int]):
        self.roots = roots
        self.start = {name: _tree(pid) for name, pid in roots.items()}
        self.last = {name: dict(tree) for name, tree in self.start.items()}

    def sample(self) -> None:
        for name, pid in self.roots.items():
            self.last[name].update(_tree(pid))

    def snapshot(self) -> dict[str, dict[int, tuple[float, int]]]:
        """The samples so far, to ask `used` about this moment later, once it is known which processes were which."""
        return {name: dict(tree) for name, tree in self.last.items()}

    def used(self, name: str, pids: set[int] | None = None, at: dict | None = None) -> float:
        """CPU seconds of the tree `name` since the start, up to the `at` snapshot or now (`pids`: only those processes)."""
        start, end = self.start[name], (at or self.last)[name]
        return sum(cpu - start.get(pid, (0.0, 0))[0] for pid, (cpu, _) in end.items() if pids is None or pid in pids)

    def descendants(self, name: str, pids: set[int]) -> set[int]:
        """`pids` and every process seen below them, ended ones included."""
        parents = {pid: parent for pid, (_, parent) in self.last[name].items()}
        found = set(pids)
        for pid in parents:
            chain = pid
            while chain in parents and chain not in found:
                chain = parents[chain]
            if chain in found:
                found.add(pid)
        return found


# What the report calls the runs of each job (the freshness sensor starts none: lib/freshness.py).
RUN_KINDS = {
    "books_sync": "sync run",
    "__ASSET_JOB": "asset job runs (Materialize, a check run from the UI)",
    "source_cleanup": "cleanup runs",
}


def _run_workers(dagster_home: Path) -> dict[str, set[int]]:
    """The run workers (spawned processes, whose command lines say nothing) of each job's runs, by job name."""
    from dagster import DagsterEventType, DagsterInstance

    workers: dict[str, set[int]] = {}
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        for run in instance.get_runs():
            # RUN_START is logged by the run worker itself (other events come from the code server that launched it).
            events = [record.dagster_event for record in instance.all_logs(run.run_id, of_type=DagsterEventType.RUN_START)]
            workers.setdefault(run.job_name, set()).update(event.pid for event in events if event is not None and event.pid)
    return workers


def _cycle_gaps(dagster_home: Path, since: float) -> list[float]:
    """Seconds from one sync cycle's start to the next, of the cycles recorded since `since` (a Unix time): the
    interval the run kept."""
    from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

    records, cursor = [], None
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        while True:
            page = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey("books_iceberg"), after_timestamp=since), limit=1000, cursor=cursor, ascending=True
            )
            records += page.records
            if not page.has_more:
                break
            cursor = page.cursor
    gaps = []
    for record in records:
        metadata = record.asset_materialization.metadata
        if metadata["cycle"].value > 1 and "seconds_since_previous_cycle" in metadata:
            gaps.append(metadata["seconds_since_previous_cycle"].value)
    return gaps


def _handover_overlaps(dagster_home: Path) -> list[float]:
    """Seconds from a sync run's launch to its predecessor's end, at each handover: how long two sync tasks run at
    once on ECS (the successor's task start and warm-up, then at most a cycle of its predecessor)."""
    from dagster import DagsterInstance, RunsFilter

    from ddb_athena.streamed.handover import SYNC_JOB_NAME

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        records = sorted(instance.get_run_records(RunsFilter(job_name=SYNC_JOB_NAME)), key=lambda record: record.create_timestamp)
    return [
        earlier.end_time - later.create_timestamp.timestamp()
        for earlier, later in zip(records, records[1:], strict=False)
        if earlier.end_time and earlier.end_time > later.create_timestamp.timestamp()
    ]


def _table_dir(warehouse: Path, namespace: str) -> Path:
    return warehouse / namespace / "books"


def request_counts(endpoint: str, reset: bool = False, path: str = COUNTS_PATH) -> dict[str, int]:
    """The requests the emulator has served since its start or the last reset, by '<service> <operation>' (at
    FILE_COUNTS_PATH: the S3 requests on tables' files, by kind of file)."""
    request = urllib.request.Request(f"{endpoint}{path}", method="POST" if reset else "GET")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _file_counts(table_dir: Path) -> dict[str, int]:
    return {
        "data_files": sum(1 for path in (table_dir / "data").rglob("*") if path.is_file() and not path.name.endswith(".crc")),
        "metadata_files": sum(1 for path in (table_dir / "metadata").rglob("*") if path.is_file() and not path.name.endswith(".crc")),
    }


def _visible_ids(table_dir: Path, wanted: set[str]) -> set[str]:
    from pyiceberg.expressions import In
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(str(table_dir))
    rows = table.scan(row_filter=In("id", tuple(wanted)), selected_fields=("id",)).to_arrow()
    return set(rows.column("id").to_pylist())


class Markers:
    """Marker items written to the books table, and when each became readable in library.books: the freshness."""

    def __init__(self, dynamodb, table: str):
        self._dynamodb, self._table = dynamodb, table
        self.written: dict[str, float] = {}
        self.seen: dict[str, float] = {}

    def write(self, name: str) -> None:
        self._dynamodb.put_item(TableName=self._table, Item={"id": {"S": name}, "name": {"S": "freshness marker"}})
        self.written[name] = time.monotonic()

    @property
    def pending(self) -> set[str]:
        return set(self.written) - set(self.seen)

    def look(self, visible: Callable[[set[str]], set[str]]) -> None:
        """Records the pending markers that `visible` (the ids among those it is given that the table holds) finds."""
        if self.pending:
            for name in visible(self.pending):
                self.seen[name] = time.monotonic()

    def lags(self) -> list[float]:
        return [self.seen[name] - self.written[name] for name in self.seen]


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def _chart(lags: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 3.5))
    axes.hist(lags, bins=20, color="#3b6ea5")
    for label, value, style in (("p50", statistics.median(lags), "--"), ("p95", _percentile(lags, 0.95), ":")):
        axes.axvline(value, color="black", linestyle=style, label=f"{label} {value:.1f} s")
    axes.set_xlabel("seconds from the DynamoDB write to the row readable in library.books")
    axes.set_ylabel("markers")
    axes.set_title(f"Freshness of library.books ({len(lags)} markers)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


@contextmanager
def local_stack(
    scratch: Path,
    rate: float | None,
    with_dagster: bool = True,
    warehouse_on_s3: bool = False,
    simulator: list[str] | None = None,
    run_start_delay: float = 0.0,
    dagster_endpoint: Callable[[str], str] | None = None,
    dagster_port: int | None = None,
) -> Iterator[tuple[dict, dict[str, subprocess.Popen]]]:
    """The emulator (counting requests: `counting_emulator`; tables created, 50 books seeded), `dagster dev` on a
    fresh DAGSTER_HOME (unless `with_dagster` is false) and the simulator at `rate` (or the `simulator` command; neither
    with `rate` None), in a scratch directory; yields the environment that points at them and the processes, and
    stops them. The warehouse
    is a local directory, or with `warehouse_on_s3` the emulator's bucket through S3A, so that every request a commit
    makes is counted. With `run_start_delay`, every run worker starts that many seconds late, as an ECS task does
    (`delayed_location`). `dagster_endpoint`, given the emulator's endpoint, returns the one `dagster dev` and its runs
    use instead (a proxy in front of it); `dagster_port`: the webserver's port (default: a free one)."""
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "dagster_home").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "dagster.yaml", scratch / "dagster_home" / "dagster.yaml")
    moto_port, dagster_port = _free_port(), dagster_port or _free_port()
    endpoint = f"http://127.0.0.1:{moto_port}"
    env = {
        **os.environ,
        "DDB_ATHENA_PROFILE": "local",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "DDB_ATHENA_WAREHOUSE": f"s3a://{Settings.from_env({}).bucket}/warehouse" if warehouse_on_s3 else (scratch / "warehouse").as_uri(),
        "DAGSTER_HOME": str(scratch / "dagster_home"),
        "DDB_ATHENA_ORDERS_START_DATE": yesterday_utc(),
        DELAY_VARIABLE: str(run_start_delay),
    }
    workspace = REPO_ROOT / "workspace.yaml"
    if run_start_delay:
        workspace = scratch / "workspace.yaml"
        workspace.write_text(f"load_from:\n  - python_module:\n      module_name: ddb_athena_bench.delayed_location\n      working_directory: {REPO_ROOT}\n")
    bin_dir = Path(sys.executable).parent
    processes = {}
    try:
        processes["emulator"] = _start([sys.executable, "-m", "ddb_athena_bench.counting_emulator", "--port", str(moto_port)], env, scratch / "emulator.log")
        wait_for_endpoint(endpoint)
        for command in (["init"], ["seed", "--books", "50", "--orders", "0"]):
            subprocess.run([str(bin_dir / "ddb-athena"), *command], env=env, cwd=REPO_ROOT, check=True, capture_output=True)
        if with_dagster:
            dagster_env = {**env, "AWS_ENDPOINT_URL": dagster_endpoint(endpoint)} if dagster_endpoint else env
            processes["dagster"] = _start(
                [str(bin_dir / "dagster"), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(dagster_port)], dagster_env, scratch / "dagster.log"
            )
        if simulator or rate is not None:
            processes["simulator"] = _start(
                simulator or [str(bin_dir / "ddb-athena"), "simulate", "--rate", str(rate), "--books-only"], env, scratch / "simulator.log"
            )
        os.environ.update({key: env[key] for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")})
        yield env, processes
    finally:
        for process in reversed(list(processes.values())):
            _stop(process)


def run(minutes: float, rate: float, run_start_delay: float = 0.0) -> dict:
    scratch = OUT / "freshness-stack"
    with local_stack(scratch, rate, run_start_delay=run_start_delay) as (env, processes):
        settings = Settings.from_env(env)
        sync = sync_settings(settings)
        table_dir = _table_dir(scratch / "warehouse", settings.namespace)
        print("waiting for the first sync to bootstrap library.books ...", flush=True)
        deadline = time.monotonic() + 600
        while not (table_dir / "data").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("library.books did not appear within 10 minutes; see " + str(scratch / "dagster.log"))
            time.sleep(2)
        files_at_start = _file_counts(table_dir)
        meter = CpuMeter({name: process.pid for name, process in processes.items()})
        dynamodb = settings.client("dynamodb")
        markers = Markers(dynamodb, settings.dynamodb_tables["books"])
        started, started_at = time.monotonic(), time.time()
        next_probe = started
        series = [{"minute": 0.0, **files_at_start, "cpu": meter.snapshot()}]
        print(f"probing for {minutes:g} minutes ...", flush=True)
        while time.monotonic() - started < minutes * 60 or (markers.pending and time.monotonic() - started < minutes * 60 + 180):
            now = time.monotonic()
            if now >= next_probe and now - started < minutes * 60:
                markers.write(f"probe-{len(markers.written):04d}")
                next_probe += PROBE_EVERY_SECONDS
            markers.look(lambda wanted: _visible_ids(table_dir, wanted))
            meter.sample()
            if time.monotonic() - started >= len(series) * SERIES_EVERY_SECONDS:
                series.append({"minute": (time.monotonic() - started) / 60, **_file_counts(table_dir), "cpu": meter.snapshot()})
            time.sleep(POLL_SECONDS)
        elapsed_minutes = (time.monotonic() - started) / 60
        files_at_end = _file_counts(table_dir)
        # Only the runs whose worker the meter saw: those that ran in the window.
        workers = {job: pids & meter.last["dagster"].keys() for job, pids in _run_workers(scratch / "dagster_home").items()}
        run_pids = {job: meter.descendants("dagster", pids) for job, pids in workers.items()}
        gaps = _cycle_gaps(scratch / "dagster_home", started_at)
        overlaps = _handover_overlaps(scratch / "dagster_home")
    lags = markers.lags()
    if not lags:
        raise RuntimeError("no marker became visible; see " + str(scratch / "dagster.log"))
    total = sum(meter.used(name) for name in meter.roots)
    sync_pids = run_pids.get("books_sync", set())
    for point in series:
        snapshot = point.pop("cpu")
        point["stack_cpu"] = sum(meter.used(name, at=snapshot) for name in meter.roots)
        point["sync_cpu"] = meter.used("dagster", sync_pids, at=snapshot)
    # Every job's runs, the sync run's included: (runs, CPU-s per minute).
    runs = {job: (len(workers[job]), meter.used("dagster", pids) / elapsed_minutes) for job, pids in run_pids.items() if workers[job]}
    return {
        "minutes": elapsed_minutes,
        "rate": rate,
        "merge_interval": sync.merge_interval_seconds,
        "longest_interval": sync.longest_merge_interval_seconds,
        "cycle_gaps": gaps,
        "handover_overlaps": overlaps,
        "markers": len(markers.written),
        "missing": len(markers.pending),
        "lags": lags,
        "p50": statistics.median(lags),
        "p95": _percentile(lags, 0.95),
        "max": max(lags),
        "sync_cpu_per_minute": runs.get("books_sync", (0, 0.0))[1],
        "dagster_cpu_per_minute": meter.used("dagster") / elapsed_minutes,
        "runs_cpu_per_minute": runs,
        "emulator_cpu_per_minute": meter.used("emulator") / elapsed_minutes,
        "simulator_cpu_per_minute": meter.used("simulator") / elapsed_minutes,
        "stack_cpu_per_minute": total / elapsed_minutes,
        "files_at_start": files_at_start,
        "files_at_end": files_at_end,
        "series": series,
    }


def busiest_hour(series: list[dict], key: str) -> float | None:
    """CPU-s a minute of `key` (cumulative at each point of the series) over its busiest 60 minutes: the target is
    per hour, and a window that spans a run's start holds more than one that does not. None under an hour."""
    points = round(3600 / SERIES_EVERY_SECONDS)
    rates = [(end[key] - start[key]) / (end["minute"] - start["minute"]) for start, end in zip(series, series[points:], strict=False)]
    return max(rates, default=None)


def report(result: dict) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            f"# Freshness of library.books ({when})",
            "",
            f"`make bench-freshness`: the local stack for {result['minutes']:.1f} minutes, simulator at {result['rate']:g} write/s, "
            f"a merge every {result['merge_interval']:g} s (DDB_ATHENA_MERGE_INTERVAL_SECONDS; a quiet table's backing off to "
            f"{result['longest_interval']:g} s), {result['markers']} markers ({result['missing']} never seen), {os.cpu_count()} cores.",
            "",
            "| what | figure | target |",
            "| --- | --- | --- |",
            f"| freshness p50 | {result['p50']:.1f} s | |",
            f"| freshness p95 | {result['p95']:.1f} s | < 30 s |",
            f"| freshness max | {result['max']:.1f} s | < 60 s |",
            f"| sync run workers, CPU-s per minute | {result['sync_cpu_per_minute']:.1f} | ≤ 10 |",
            *(
                f"| seconds from one sync cycle's start to the next ({len(gaps)} cycles), p50 / p95 / max | "
                f"{statistics.median(gaps):.1f} / {_percentile(gaps, 0.95):.1f} / {max(gaps):.1f} | |"
                for gaps in [result["cycle_gaps"]]
                if gaps
            ),
            *(
                f"| two sync runs at once at a handover ({len(overlaps)}), seconds mean / max | {statistics.mean(overlaps):.1f} / {max(overlaps):.1f} | |"
                for overlaps in [result["handover_overlaps"]]
                if overlaps
            ),
            f"| `dagster dev` with its daemon, code server, webserver and all runs, CPU-s per minute | {result['dagster_cpu_per_minute']:.1f} | |",
            *(
                # The same work every run: their CPU-s a run show how fast the host was, to compare reports of
                # different days.
                f"| of which {RUN_KINDS.get(job, f'{job} runs')} ({runs}, {cpu * result['minutes'] / runs:.2f} CPU-s each), CPU-s per minute | {cpu:.1f} | |"
                for job, (runs, cpu) in sorted(result["runs_cpu_per_minute"].items())
                if job != "books_sync"
            ),
            f"| emulator, CPU-s per minute | {result['emulator_cpu_per_minute']:.1f} | |",
            f"| simulator, CPU-s per minute | {result['simulator_cpu_per_minute']:.1f} | |",
            f"| whole stack, CPU-s per minute | {result['stack_cpu_per_minute']:.1f} | ≤ 20 |",
            *(
                f"| {what}, CPU-s per minute over the busiest 60 minutes | {busiest:.1f} | ≤ {target} |"
                for what, key, target in (("sync run workers", "sync_cpu", 10), ("whole stack", "stack_cpu", 20))
                for busiest in [busiest_hour(result["series"], key)]
                if busiest is not None
            ),
            f"| library.books data files, start → end | {result['files_at_start']['data_files']} → {result['files_at_end']['data_files']} | bounded |",
            f"| library.books metadata files, start → end | {result['files_at_start']['metadata_files']} → "
            f"{result['files_at_end']['metadata_files']} | bounded |",
            "",
            "![lag distribution](freshness.png)",
            "",
            "Over time (CPU over the preceding interval):",
            "",
            "| minute | data files | metadata files | sync run, CPU-s per minute | whole stack, CPU-s per minute |",
            "| --- | --- | --- | --- | --- |",
            *(
                f"| {now['minute']:.0f} | {now['data_files']} | {now['metadata_files']} | "
                + (" | ".join(f"{(now[key] - before[key]) / (now['minute'] - before['minute']):.1f}" for key in ("sync_cpu", "stack_cpu")) if before else " |")
                + " |"
                for before, now in zip([None, *result["series"]], result["series"], strict=False)
            ),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--run-start-delay", type=float, default=0.0, help="seconds every run worker starts late, as an ECS task does")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    result = run(args.minutes, args.rate, args.run_start_delay)
    _chart(result["lags"], OUT / "freshness.png")
    text = report(result)
    (OUT / "freshness.md").write_text(text)
    print(text)
    print(f"report: {OUT / 'freshness.md'}, chart: {OUT / 'freshness.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
