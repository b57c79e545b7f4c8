"""`make bench-interruption`: what ECS stopping the sync's task costs (a Fargate Spot interruption), on the real local stack.

What `make dev` starts, in a scratch directory, with every run worker starting `--run-start-delay` seconds late (90:
as an ECS task does, `delayed_location`), the load generator at `--rate` writes a second (the requirement's 230), and
a marker item every few seconds polled in library.books with PyIceberg (from the table's metadata, as Athena reads
it). After the warm-up, the sync's task is stopped as ECS stops it (SIGTERM to its run worker, SIGKILL of what is left
120 s later); the markers go on for `--after-minutes`. Reports:

- freshness p50 / p95 / max over the whole window, and of the markers written from the SIGTERM until the successor's
  first commit and a minute after (the interruption's share);
- the gap between the interrupted run's last commit and its successor's first, when the successor was launched
  (and by what), how the interrupted run ended (by itself before the kill, or killed);
- whether library.books holds exactly DynamoDB's keys at the end (nothing lost, nothing left behind).

    .venv/bin/python -m ddb_athena_bench.interruption [--rate 230] [--warmup-minutes 5] [--after-minutes 5]
"""

import argparse
import statistics
import sys
import threading
import time
from datetime import UTC, datetime

from ddb_athena.lib.settings import Settings
from ddb_athena_bench.freshness import OUT, Markers, _percentile, _start, _stop, _table_dir, _visible_ids, local_stack
from ddb_athena_bench.volume import _load_command
from ddb_athena_faults.dagster_api import running_sync, stop_as_ecs_does

PROBE_EVERY_SECONDS = 3.0
# The interruption's share of the markers: those written from the SIGTERM until this long after the successor's first commit.
SETTLED_SECONDS = 60.0


def _commits(instance, since: float) -> list:
    """books_iceberg materializations that merged changes since `since` (a Unix time), oldest first."""
    from dagster import AssetKey, AssetRecordsFilter

    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("books_iceberg"), after_timestamp=since), limit=10_000).records
    return sorted((r for r in records if r.asset_materialization.metadata["files_consumed"].value), key=lambda record: record.timestamp)


def _keys(settings: Settings, table_dir) -> tuple[set[str], set[str]]:
    """Every key of the books table in DynamoDB, and in library.books."""
    from pyiceberg.table import StaticTable

    dynamodb, keys = settings.client("dynamodb"), set()
    for page in dynamodb.get_paginator("scan").paginate(TableName=settings.dynamodb_tables["books"], ProjectionExpression="id"):
        keys |= {item["id"]["S"] for item in page["Items"]}
    rows = StaticTable.from_metadata(str(table_dir)).scan(selected_fields=("id",)).to_arrow()
    return keys, set(rows.column("id").to_pylist())


def run(rate: float, warmup_minutes: float, after_minutes: float, run_start_delay: float, processes: int) -> dict:
    from dagster import DagsterInstance

    scratch = OUT / "interruption-stack"
    with local_stack(scratch, rate=None, run_start_delay=run_start_delay) as (env, running):
        settings = Settings.from_env(env)
        table_dir = _table_dir(scratch / "warehouse", settings.namespace)
        dagster_home = scratch / "dagster_home"
        print("waiting for the first sync run to bootstrap library.books ...", flush=True)
        deadline = time.monotonic() + 900
        while not (table_dir / "data").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"library.books did not appear within 15 minutes; see {scratch / 'dagster.log'}")
            time.sleep(2)
        # The load starts once the table exists: a bootstrap's scan of a table written at the full rate from the start
        # measures the emulator, not the interruption.
        running["load"] = load = _start(_load_command(rate, processes), env, scratch / "load.log")
        markers = Markers(settings.client("dynamodb"), settings.dynamodb_tables["books"])
        written_at: dict[str, float] = {}  # Unix time of each marker, to place it against the commits
        started, stop = time.monotonic(), {}

        def interrupt() -> None:
            with DagsterInstance.from_config(str(dagster_home)) as instance:
                found = running_sync(instance)
            if found is None:
                stop["error"] = "no sync run was running at the interruption"
                return
            victim, pid = found
            stop.update(run_id=victim.run_id, at=time.time())
            print(f"stopping sync run {victim.run_id} as ECS does (SIGTERM, SIGKILL 120 s later) ...", flush=True)
            stopped = stop_as_ecs_does(pid)
            stop["worker_ended"], stop["killed"] = stopped.worker_ended, len(stopped.killed)
            stop["ended"] = time.time()

        stopper = threading.Thread(target=interrupt)
        print(f"probing for {warmup_minutes:g} minutes, then stopping the sync's task, then {after_minutes:g} minutes ...", flush=True)
        next_probe, end = started, warmup_minutes * 60 + after_minutes * 60
        while time.monotonic() - started < end or (markers.pending and time.monotonic() - started < end + 180):
            now = time.monotonic()
            if now - started >= warmup_minutes * 60 and not stopper.is_alive() and not stop:
                stopper.start()
            if now >= next_probe and now - started < end:
                name = f"probe-{len(markers.written):05d}"
                markers.write(name)
                written_at[name] = time.time()
                next_probe += PROBE_EVERY_SECONDS
            markers.look(lambda wanted: _visible_ids(table_dir, wanted))
            time.sleep(0.5)
        stopper.join()
        _stop(load)
        # The load stopped: the sync merges what it wrote last within a few cycles.
        caught_up_by = time.monotonic() + 300
        while (keys := _keys(settings, table_dir))[0] != keys[1] and time.monotonic() < caught_up_by:
            time.sleep(10)
        in_dynamodb, in_table = keys
        with DagsterInstance.from_config(str(dagster_home)) as instance:
            if "run_id" not in stop:
                raise RuntimeError(stop.get("error", "the sync was not stopped"))
            victim_record = instance.get_run_record_by_id(stop["run_id"])
            victim = victim_record.dagster_run
            commits = _commits(instance, stop["at"] - 600)
            last = max((c.timestamp for c in commits if c.run_id == victim.run_id), default=None)
            successor_commits = [c for c in commits if c.run_id != victim.run_id and c.timestamp > stop["at"]]
            first = successor_commits[0] if successor_commits else None
            successor = instance.get_run_by_id(first.run_id) if first else None
            successor_record = instance.get_run_record_by_id(first.run_id) if first else None
    lags = markers.lags()
    if not lags:
        raise RuntimeError(f"no marker became visible; see {scratch / 'dagster.log'}")
    window_end = (first.timestamp if first else stop["ended"]) + SETTLED_SECONDS
    during = [markers.seen[name] - markers.written[name] for name, at in written_at.items() if stop["at"] <= at <= window_end and name in markers.seen]
    return {
        "rate": rate,
        "run_start_delay": run_start_delay,
        "markers": len(markers.written),
        "missing": len(markers.pending),
        "p50": statistics.median(lags),
        "p95": _percentile(lags, 0.95),
        "max": max(lags),
        "during": len(during),
        "during_p95": _percentile(during, 0.95) if during else None,
        "during_max": max(during) if during else None,
        "victim_status": victim.status.value,
        "killed": stop["killed"],
        "victim_ended_after": victim_record.end_time - stop["at"] if victim_record.end_time else None,
        "worker_ended_after": stop["ended"] - stop["at"],
        "worker_ended": stop["worker_ended"],
        "gap": first.timestamp - last if first and last else None,
        "successor_launched_after": successor_record.create_timestamp.timestamp() - stop["at"] if successor_record else None,
        "successor_by": successor.tags.get("dagster/sensor_name") or successor.tags.get("dagster/schedule_name") if successor else None,
        "keys_lost": len(in_dynamodb - in_table),
        "keys_left_behind": len(in_table - in_dynamodb),
    }


def report(result: dict) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    def seconds(value) -> str:
        return "none" if value is None else f"{value:.1f} s"

    return "\n".join(
        [
            f"# The sync's task stopped as ECS stops it ({when})",
            "",
            f"`make bench-interruption`: the local stack under {result['rate']:g} writes a second, every run worker starting "
            f"{result['run_start_delay']:g} s late, {result['markers']} markers ({result['missing']} never seen).",
            "",
            "| what | figure |",
            "| --- | --- |",
            f"| freshness p50 / p95 / max, whole window | {result['p50']:.1f} / {result['p95']:.1f} / {result['max']:.1f} s |",
            f"| freshness p95 / max of the {result['during']} markers from the SIGTERM to a minute after the successor's first commit | "
            f"{seconds(result['during_p95'])} / {seconds(result['during_max'])} |",
            f"| the successor launched after the SIGTERM (by) | {seconds(result['successor_launched_after'])} ({result['successor_by']}) |",
            f"| the interrupted run ended after the SIGTERM, status | {seconds(result['victim_ended_after'])}, {result['victim_status']} |",
            f"| its worker (the task's command) ended after the SIGTERM | {seconds(result['worker_ended_after'])}"
            f"{'' if result['worker_ended'] else ', killed at 120 s'}; {result['killed']} processes left at the task's end |",
            f"| last commit of the interrupted run to the first of its successor | {seconds(result['gap'])} |",
            f"| keys in DynamoDB missing from library.books / in library.books only, at the end | {result['keys_lost']} / {result['keys_left_behind']} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=230.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--after-minutes", type=float, default=5.0)
    parser.add_argument("--run-start-delay", type=float, default=90.0, help="seconds every run worker starts late, as an ECS task does")
    parser.add_argument("--processes", type=int, default=4, help="load generator processes")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    result = run(args.rate, args.warmup_minutes, args.after_minutes, args.run_start_delay, args.processes)
    text = report(result)
    (OUT / "interruption.md").write_text(text)
    print(text)
    print(f"report: {OUT / 'interruption.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
