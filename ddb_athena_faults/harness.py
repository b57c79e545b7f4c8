"""`make faults`: the local stack under writes and a nemesis, held against what readers must see (issue 54).

Starts what `make dev` starts in a scratch directory (the emulator, `dagster dev` with its daemon, schedules and
sensors), with the fault proxy between Dagster and the emulator; writes versioned keys to books and reviews (a
composite key) straight to the emulator; polls both tables' `main` with PyIceberg; lets the nemesis inject faults for
`--minutes`; deletes a row from library.books by hand under the faults (the checks must turn red); then lets the stack
quiet down and compares every table with DynamoDB. Reports faults by kind, recoveries p50/max by kind and anomalies by
kind, as Markdown under .ddb_athena/bench/faults/; exits 1 on any anomaly.

    .venv/bin/python -m ddb_athena_faults.harness [--minutes 60] [--seed 0]
"""

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dagster import DagsterInstance

from ddb_athena.lib.declarations import declared_tables
from ddb_athena.lib.resources import sync_settings
from ddb_athena.lib.settings import LOCAL_STATE_DIR, REPO_ROOT, Settings
from ddb_athena_bench.freshness import _free_port, local_stack
from ddb_athena_faults.checker import LOST, Anomaly, Checker, read_rows
from ddb_athena_faults.dagster_api import Webserver, check_evaluations, end_runs_whose_worker_died, run_failures, run_status
from ddb_athena_faults.nemesis import FINISHED, Nemesis, Stage
from ddb_athena_faults.proxy import FaultPlan, FaultProxy
from ddb_athena_faults.run_outcomes import classify_runs
from ddb_athena_faults.versioned_writes import VersionedWriter, key_of

OUT = LOCAL_STATE_DIR / "bench" / "faults"
POLL_SECONDS = 3.0
WORKER_CHECK_SECONDS = 10.0
# The first sync run: the schedule's next minute, a JVM, both tables bootstrapped, on two busy cores.
FIRST_SYNC_SECONDS = 900
QUIET_SECONDS = 600
NOT_RECOVERED = "fault not recovered"
OVER_BOUND = "recovery over the bound"
HAND_DELETE_MISSED = "hand delete not detected"


@dataclass
class Outcome:
    minutes: float
    seed: int
    bound: float
    faults: list = field(default_factory=list)
    recoveries: dict[str, list[float]] = field(default_factory=dict)
    anomalies: list[Anomaly] = field(default_factory=list)
    injected: Counter = field(default_factory=Counter)
    requests: Counter = field(default_factory=Counter)
    runs: dict[str, Counter] = field(default_factory=dict)
    hand_delete: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _every(seconds: float, stop: threading.Event, action) -> threading.Thread:
    def loop():
        while not stop.wait(seconds):
            action()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _wait(what: str, condition, timeout: float, poll: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll)


def fault_clusters(faults) -> dict[int, float]:
    """For each fault (by index), the end of the cluster of faults overlapping it, directly or through others: the
    stack recovers from all of them at once, from the last one's end."""
    order = sorted(range(len(faults)), key=lambda index: faults[index].started)
    ends, cluster, cluster_end = {}, [], None
    for index in order:
        if cluster and faults[index].started > cluster_end:
            ends.update(dict.fromkeys(cluster, cluster_end))
            cluster = []
        cluster.append(index)
        cluster_end = max(cluster_end or faults[index].ended, faults[index].ended) if len(cluster) > 1 else faults[index].ended
    ends.update(dict.fromkeys(cluster, cluster_end))
    return ends


def recoveries(faults, checker: Checker, bound: float) -> tuple[dict[str, list[float]], list[Anomaly]]:
    found, anomalies = {}, []
    for index, end in fault_clusters(faults).items():
        fault = faults[index]
        caught_up = checker.caught_up_after(end)
        if caught_up is None:
            anomalies.append(Anomaly(NOT_RECOVERED, "-", (fault.kind,), f"no write after its end ({fault.detail or fault.target}) became visible"))
            continue
        seconds = caught_up - end
        found.setdefault(fault.kind, []).append(seconds)
        if seconds > bound:
            anomalies.append(Anomaly(OVER_BOUND, "-", (fault.kind,), f"{seconds:.0f} s > {bound:g} s ({fault.detail or fault.target})"))
    return found, anomalies


def hand_delete(env: dict, dynamodb, settings: Settings, nemesis: Nemesis, dagster_home: Path) -> dict:
    """Deletes one of the seeded books (which the load never writes) from library.books with Spark SQL, as a person
    would, under the faults; no bootstrap (which would rebuild the row from DynamoDB) runs or starts after it."""
    nemesis.bootstraps_allowed = False
    with DagsterInstance.from_config(str(dagster_home)) as instance:

        def bootstrapping() -> bool:
            return any(run.job_name.endswith("_bootstrap") and not run.is_finished for run in instance.get_runs(limit=50))

        _wait("bootstraps to end before the hand delete", lambda: not bootstrapping(), 900)
    books = declared_tables()["books"]
    ids = (key_of(books, item)[0] for item in _scan(dynamodb, settings.dynamodb_tables["books"]))
    victim = min(book_id for book_id in ids if not book_id.startswith("fault-"))
    target = sync_settings(settings).iceberg_table_of(books)
    command = [str(Path(sys.executable).parent / "ddb-athena"), "query", f"DELETE FROM {target} WHERE id = '{victim}'"]
    done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    return {"key": (victim,), "deleted": done.returncode == 0, "error": done.stderr[-500:] if done.returncode else ""}


def run(minutes: float, seed: int, rate: float, keys: int, mean_gap: float, bound: float) -> Outcome:
    outcome = Outcome(minutes, seed, bound)
    scratch = OUT / "stack"
    plan = FaultPlan(random.Random(seed))
    proxies: list[FaultProxy] = []

    def start_proxy(emulator: str) -> str:
        proxies.append(FaultProxy(emulator, plan).start())
        return proxies[0].endpoint

    dagster_port = _free_port()
    streamed = {name: table for name, table in declared_tables().items() if table.kind == "streamed"}
    with local_stack(scratch, rate=None, dagster_endpoint=start_proxy, dagster_port=dagster_port) as (env, processes):
        settings = Settings.from_env(env)
        dagster_home = scratch / "dagster_home"
        dynamodb = settings.client("dynamodb")
        writer = VersionedWriter(dynamodb, streamed, settings.dynamodb_tables, rate, keys, seed)
        table_dirs = {name: scratch / "warehouse" / settings.namespace / table.iceberg_table for name, table in streamed.items()}
        checker = Checker(streamed, table_dirs, writer.snapshot)
        stop = threading.Event()
        writer.start()
        load_started = time.monotonic()
        print("waiting for the first sync run to bootstrap the streamed tables ...", flush=True)
        _every(POLL_SECONDS, stop, checker.poll)
        webserver = Webserver(f"http://127.0.0.1:{dagster_port}")
        webserver.wait_until_serving(FIRST_SYNC_SECONDS)
        with DagsterInstance.from_config(str(dagster_home)) as instance:
            _every(WORKER_CHECK_SECONDS, stop, lambda: end_runs_whose_worker_died(instance))
            _wait("the first sync to show the load's writes", lambda: checker.caught_up_after(load_started), FIRST_SYNC_SECONDS)
            stage = Stage(
                dagster_home, webserver, proxies[0], plan, {**env, "AWS_ENDPOINT_URL": proxies[0].endpoint},
                settings.writer_lease_seconds, scratch, sorted(streamed),
            )  # fmt: skip
            nemesis = Nemesis(stage, random.Random(seed), mean_gap)
            hand_deleted = {}
            timer = threading.Timer(minutes * 60 * 0.6, lambda: hand_deleted.update(hand_delete(env, dynamodb, settings, nemesis, dagster_home)))
            timer.start()
            print(f"faults for {minutes:g} minutes (seed {seed}) ...", flush=True)
            nemesis.run_for(minutes * 60)
            timer.join()
            faults_over = time.monotonic()
            print("faults over; waiting for the stack to catch up ...", flush=True)
            try:
                _wait("the sync to catch up after the faults", lambda: checker.caught_up_after(faults_over), bound)
            except TimeoutError as error:
                outcome.notes.append(str(error))
            writer.stop()
            unexpected, reader_detected = _quiet_differences(checker, streamed, table_dirs, dynamodb, settings, hand_deleted.get("key"))
            outcome.anomalies += unexpected
            stop.set()
            outcome.hand_delete = {**_parity_after_hand_delete(stage, hand_deleted), "reader_detected": reader_detected}
        outcome.faults = nemesis.faults
        outcome.recoveries, late = recoveries(nemesis.faults, checker, bound)
        outcome.anomalies = checker.anomalies + late + outcome.anomalies
        outcome.injected, outcome.requests = Counter(plan.injected), Counter(plan.requests)
        outcome.runs, live_failed = classify_runs(dagster_home, nemesis.stale_runs, nemesis.launched_runs)
        outcome.anomalies += live_failed
        outcome.notes += [f"fault not inflicted: {error}" for error in nemesis.errors]
        if shutil.which("faketime") is None:
            outcome.notes.append("clock skew not injected: faketime (libfaketime) is not installed")
        outcome.notes += [f"reads that failed ({reason}): {count}" for reason, count in checker.read_errors.items()]
        outcome.notes.append(f"load: {sum(len(log.versions) for logs in writer.logs.values() for log in logs.values())} writes, {writer.failed_writes} failed")
        outcome.notes.append(f"endpoint restarts (proxy refusals): {proxies[0].refusals}")
        failures = run_failures(dagster_home)
        outcome.notes += [f"failed run {failure.run_id[:8]} ({failure.job}): {failure.message[:300]}" for failure in failures]
        for proxy in proxies:
            proxy.stop()
    if outcome.hand_delete.get("reader_detected") is False or outcome.hand_delete.get("parity_passed") is not False:
        outcome.anomalies.append(Anomaly(HAND_DELETE_MISSED, "books", outcome.hand_delete.get("key", ()), str(outcome.hand_delete)))
    return outcome


def _quiet_differences(checker: Checker, streamed: dict, table_dirs: dict, dynamodb, settings: Settings, hand_deleted_key) -> tuple[list[Anomaly], bool]:
    """Once the load has stopped: waits until every table equals DynamoDB (but for the hand-deleted row), at most
    QUIET_SECONDS, then returns how they differ, and whether the hand-deleted row is among the differences (the
    checker's own red)."""

    def differences() -> list[Anomaly]:
        found = []
        for name in streamed:
            items = _scan(dynamodb, settings.dynamodb_tables[name])
            found += checker.differences(name, items, read_rows(table_dirs[name]))
        return found

    deadline = time.monotonic() + QUIET_SECONDS
    while True:
        found = differences()
        unexpected = [anomaly for anomaly in found if not (anomaly.kind == LOST and anomaly.table == "books" and anomaly.key == hand_deleted_key)]
        if not unexpected or time.monotonic() > deadline:
            break
        time.sleep(10)
    return unexpected, any(anomaly.kind == LOST and anomaly.key == hand_deleted_key for anomaly in found)


def _scan(dynamodb, table: str) -> list[dict]:
    items, start = [], {}
    while True:
        page = dynamodb.scan(TableName=table, ConsistentRead=True, **start)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return items
        start = {"ExclusiveStartKey": page["LastEvaluatedKey"]}


def _parity_after_hand_delete(stage: Stage, hand_deleted: dict) -> dict:
    """The books key parity job, launched as the UI does: its check must fail on the hand-deleted row."""
    result = dict(hand_deleted)
    if not hand_deleted.get("deleted"):
        return result
    run_id = stage.webserver.launch("books_key_parity")
    _wait("the key parity run", lambda: run_status(stage.dagster_home, run_id) in FINISHED, 900, poll=5)
    evaluations = check_evaluations(stage.dagster_home, run_id)
    result["parity_run"] = run_id
    result["parity_passed"] = evaluations.get("books_row_count_parity")
    return result


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def report(outcome: Outcome) -> str:
    kinds = Counter(fault.kind for fault in outcome.faults)
    anomalies = Counter(anomaly.kind for anomaly in outcome.anomalies)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Fault harness ({when})",
        "",
        f"`make faults MINUTES={outcome.minutes:g} SEED={outcome.seed}`: {sum(kinds.values())} faults; every fault must be recovered "
        f"(a write made after it readable in `main`) within {outcome.bound:g} s of the end of the faults overlapping it.",
        "",
        "| fault | count | recovery p50 | recovery max |",
        "| --- | --- | --- | --- |",
        *(
            f"| {kind} | {count} | "
            + (f"{statistics.median(seconds):.0f} s | {max(seconds):.0f} s |" if (seconds := outcome.recoveries.get(kind)) else "- | - |")
            for kind, count in sorted(kinds.items())
        ),
        "",
        f"**Anomalies: {sum(anomalies.values())}**" + ("" if anomalies else " (none)"),
        "",
        *(f"- {kind}: {count}" for kind, count in sorted(anomalies.items())),
        *(f"  - {anomaly.kind} {anomaly.table} {anomaly.key}: {anomaly.detail}" for anomaly in outcome.anomalies[:40]),
        "",
        "Requests the proxy faulted, by fault: "
        + (", ".join(f"{fault.value} {count}" for fault, count in sorted(outcome.injected.items())) or "none")
        + f" (of {sum(outcome.requests.values())} S3 and DynamoDB requests).",
        "",
        "Hand delete of a row from library.books under the faults: "
        + (
            f"key {outcome.hand_delete.get('key')}, deleted {outcome.hand_delete.get('deleted')}; the reader's final comparison "
            f"flagged it: {outcome.hand_delete.get('reader_detected')}; books_row_count_parity passed: {outcome.hand_delete.get('parity_passed')} "
            f"(run {outcome.hand_delete.get('parity_run', '-')})"
            if outcome.hand_delete
            else "not done"
        ),
        "",
        "Runs by kind and status:",
        "",
        *(f"- {kind}: " + ", ".join(f"{status} {count}" for status, count in sorted(statuses.items())) for kind, statuses in sorted(outcome.runs.items())),
        "",
        "Faults in order (seconds from the first):",
        "",
        *(
            f"- {fault.started - outcome.faults[0].started:6.0f}-{fault.ended - outcome.faults[0].started:.0f} {fault.kind} {fault.target} {fault.detail}"
            for fault in sorted(outcome.faults, key=lambda fault: fault.started)
        ),
        "",
        "Notes:",
        "",
        *(f"- {note}" for note in outcome.notes),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the nemesis injects faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=4.0, help="the load's writes a second, both tables together")
    parser.add_argument("--keys", type=int, default=24, help="keys the load writes in each table")
    parser.add_argument("--mean-gap", type=float, default=40.0, help="mean seconds between fault starts")
    parser.add_argument("--recovery-bound", type=float, default=420.0, help="seconds within which every fault must be recovered")
    args = parser.parse_args(argv)
    outcome = run(args.minutes, args.seed, args.rate, args.keys, args.mean_gap, args.recovery_bound)
    OUT.mkdir(parents=True, exist_ok=True)
    text = report(outcome)
    path = OUT / f"faults-seed{args.seed}.md"
    path.write_text(text)
    print(text)
    print(f"report: {path}")
    return 1 if outcome.anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
