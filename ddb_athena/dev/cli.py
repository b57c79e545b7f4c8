"""The `ddb-athena` command: local stack, init, seed, simulate, query, launch, and the runs `make dev` leaves behind.

Each command imports what it needs when it runs, so that the emulator and the simulator start in a second, without
loading Dagster or Spark."""

import argparse
import contextlib
import os
import random
import signal
import sys
import threading
from datetime import UTC, datetime

from ddb_athena.lib.declarations import declared_tables
from ddb_athena.lib.settings import LOCAL_STACK_PORT, Settings

# Long enough for a webserver that is up to answer; `make dev`, which launches before its webserver starts, waits longer.
DEFAULT_READY_TIMEOUT_SECONDS = 15.0


def _local_stack(args, settings: Settings) -> int:
    from ddb_athena.dev.local_stack import start_moto_server

    # The handler before the banner: a SIGTERM right after it (make dev stopping early, a test) stops cleanly.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = start_moto_server(args.port)
    print(f"AWS emulator (moto) listening on http://127.0.0.1:{args.port} — Ctrl-C to stop", flush=True)
    # Waited in slices: the kernel may deliver the signal to the server's thread, and Python runs the handler only
    # when this (main) thread wakes, which a wait without a timeout never does.
    with contextlib.suppress(KeyboardInterrupt):
        while not stop.wait(timeout=0.5):
            pass
    server.stop()
    return 0


def _init(args, settings: Settings) -> int:
    from ddb_athena.dev.local_stack import create_demo_resources

    if not settings.is_local and not args.yes:
        print(
            f"Refusing to create tables and buckets in the aws profile (region {settings.region}) without --yes.",
            file=sys.stderr,
        )
        return 2
    for line in create_demo_resources(settings) or ["everything already exists"]:
        print(line)
    return 0


def _seeded_traffic(settings: Settings, rng: random.Random) -> list:
    """Traffic for each declared table with seed items (ddb_athena/dev/seeds/<name>.json)."""
    from ddb_athena.dev.simulate import SeededTraffic, seed_items

    dynamodb = settings.client("dynamodb")
    return [
        SeededTraffic(dynamodb, table, settings.dynamodb_tables[name], seeds, rng)
        for name, table in declared_tables().items()
        if (seeds := seed_items(name)) is not None
    ]


def _simulator(args, settings: Settings, with_orders: bool):
    from ddb_athena.dev.simulate import BookSimulator

    rng = random.Random(args.seed)
    # Updates and deletes belong to streamed tables; an exported one is only seeded (its documents are immutable).
    seeded = [traffic for traffic in _seeded_traffic(settings, rng) if traffic.table.kind == "streamed"] if with_orders else []
    tables = settings.dynamodb_tables
    simulator = BookSimulator(settings.client("dynamodb"), tables["books"], tables["orders"] if with_orders else None, rng=rng, seeded=seeded)
    simulator.load_existing_ids()
    for traffic in seeded:
        traffic.load_existing_keys()
    return simulator


def _seed(args, settings: Settings) -> int:
    from datetime import datetime, timedelta

    from ddb_athena.dev.simulate import order_item

    simulator = _simulator(args, settings, with_orders=False)
    for _ in range(args.books):
        simulator.insert()
    now = datetime.now(UTC)
    for index in range(args.orders):
        created = now - timedelta(days=1, seconds=index * 60)
        simulator.dynamodb.put_item(TableName=settings.dynamodb_tables["orders"], Item=order_item(simulator.rng, created))
    seeded = [f"{traffic.seed()} {traffic.table.name}" for traffic in _seeded_traffic(settings, simulator.rng)]
    print(f"seeded {args.books} books and {args.orders} orders" + "".join(f", {line}" for line in seeded))
    return 0


def _simulate(args, settings: Settings) -> int:
    simulator = _simulator(args, settings, with_orders=not args.books_only)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        counts = simulator.run(args.rate, args.duration, should_stop=stop.is_set, operations=args.operations)
    except KeyboardInterrupt:
        counts = simulator.counts
    print(" ".join(f"{name}={count}" for name, count in counts.items()), flush=True)
    return 0


def _query(args, settings: Settings) -> int:
    from ddb_athena.lake.query import rows_as_json, rows_as_table, run_query
    from ddb_athena.resources import resources_from_settings

    spark = resources_from_settings(settings)["spark"].spark_session
    spark.sparkContext.setLogLevel("ERROR")
    columns, rows = run_query(spark, args.sql)
    print(rows_as_json(columns, rows) if args.format == "json" else rows_as_table(columns, rows))
    return 0


def _print_now(line: str) -> None:
    print(line, flush=True)


def _followed(args, run_id: str) -> int:
    """With --follow, logs the run's status until it finishes: 0 if it succeeded, else 1."""
    from dagster import DagsterRunStatus

    from ddb_athena.dev.launch import follow_run

    if not args.follow:
        return 0
    return 0 if follow_run(args.webserver, run_id, _print_now) == DagsterRunStatus.SUCCESS else 1


def _launch(args, settings: Settings) -> int:
    from ddb_athena.dev.launch import launch_partition_run, yesterday_utc

    partition = args.partition or yesterday_utc()
    return _followed(args, launch_partition_run(args.webserver, args.job, partition, args.ready_timeout, _print_now))


def _bootstrap(args, settings: Settings) -> int:
    from ddb_athena.dev.launch import launch_run

    return _followed(args, launch_run(args.webserver, f"{args.table}_bootstrap", {}, f" for {args.table}", args.ready_timeout, _print_now))


def _replay_failures(args, settings: Settings) -> int:
    from ddb_athena.lib.declarations import declared_tables, streamed_table_of
    from ddb_athena.lib.resources import sync_settings
    from ddb_athena.lib.source_layout import SourceLayout
    from ddb_athena.streamed.capture.failed_batches import keep_failed_batches, replay

    queue_urls = [args.queue_url] if args.queue_url else list(sync_settings(settings).capture_failure_queue_urls.values())
    if not queue_urls:
        print("No queue: pass --queue-url or set DDB_ATHENA_CAPTURE_FAILURE_QUEUE_URLS (the stack's CaptureFailureQueueUrls)", file=sys.stderr)
        return 2

    # Each batch into its own table's prefix: a queue may hold the batches of several streams.
    def layout_of(stream_arn: str) -> SourceLayout:
        return SourceLayout(settings.bucket, streamed_table_of(stream_arn, os.environ).source_prefix)

    s3 = settings.client("s3")
    for queue_url in queue_urls:
        print(f"{queue_url}: {keep_failed_batches(settings.client('sqs'), s3, queue_url, layout_of)} failed batches moved to S3")
    layouts = [SourceLayout(settings.bucket, table.source_prefix) for table in declared_tables().values() if table.kind == "streamed"]
    result = replay(settings.client("dynamodbstreams"), s3, layouts, log=print)
    print(f"{result.records} records captured again in {len(result.replayed)} change files")
    if not result.kept:
        return 0
    gone = ", ".join(batch.range_name for batch in result.not_replayable) or "none"
    unfinished = ", ".join(batch.range_name for batch in result.unfinished) or "none"
    print(
        f"{result.kept} batches kept; no longer in the stream (a bootstrap recovers them): {gone}; "
        f"not read to their end (run replay-failures again): {unfinished}",
        file=sys.stderr,
    )
    return 1


def _restore_table(args, settings: Settings) -> int:
    from ddb_athena.lake.table_spec import tombstone_table
    from ddb_athena.lib.declarations import declared
    from ddb_athena.lib.table_recovery import RecoveryError, restore_glue_table
    from ddb_athena.lib.writer_lease import LeaseHeldError, WriterLease

    if settings.is_local:
        print("restore-table restores a table of the Glue catalog in a versioned bucket: run it with DDB_ATHENA_PROFILE=aws", file=sys.stderr)
        return 2
    table = declared(args.table)
    at = datetime.fromisoformat(args.to)
    if at.tzinfo is None:
        print(f"--to {args.to}: give the time with its offset (2026-12-04T10:00:00+00:00)", file=sys.stderr)
        return 2
    qualified = f"{settings.namespace}.{table.iceberg_table}"
    # A streamed table's tombstones go back with it: its deletes and its rows are one state.
    iceberg_tables = [table.iceberg_table] + ([tombstone_table(table.iceberg_table)] if table.kind == "streamed" else [])
    s3, glue = settings.client("s3"), settings.client("glue")
    try:
        if args.dry_run:
            for name in iceberg_tables:
                plan, _ = restore_glue_table(s3, glue, settings.namespace, name, at, apply=False)
                print(f"{settings.namespace}.{name} at {at.isoformat()}: {len(plan.copy_back)} objects to copy back, {len(plan.hide)} to hide")
            return 0
        # As its one writer: the sync or a load waits for the lease, and a writer that held it is fenced out.
        with WriterLease(s3, settings.bucket, qualified, "ddb-athena restore-table", settings.writer_lease_seconds):
            for name in iceberg_tables:
                plan, previous = restore_glue_table(s3, glue, settings.namespace, name, at)
                print(
                    f"{settings.namespace}.{name} is as it was at {at.isoformat()}: {len(plan.copy_back)} objects copied back, "
                    f"{len(plan.hide)} hidden; it pointed at {previous}"
                )
    except (RecoveryError, LeaseHeldError) as error:
        print(f"{qualified}: {error}", file=sys.stderr)
        return 1
    return 0


def _instance_migrate(args, settings: Settings) -> int:
    from dagster import DagsterInstance

    from ddb_athena.lib.instance_schema import SchemaGateError, migrate_behind_gate

    with DagsterInstance.get() as instance:
        try:
            state = migrate_behind_gate(
                instance, settings.client("rds"), os.environ.get("DDB_ATHENA_DATABASE_INSTANCE"), os.environ.get("DDB_ATHENA_SCHEMA_MIGRATION_SNAPSHOT")
            )
        except SchemaGateError as error:
            print(f"platform: {error}", file=sys.stderr)
            return 1
    print(f"The instance's schema is at {state.head}")
    return 0


def _test_alert(args, settings: Settings) -> int:
    from ddb_athena.lib import alert_topic
    from ddb_athena.lib.resources import sync_settings

    sync = sync_settings(settings)
    if not sync.alert_topic_arn:
        print("No alert topic (DDB_ATHENA_ALERT_TOPIC_ARN): alerts reach nobody", file=sys.stderr)
        return 1
    image = os.environ.get("DAGSTER_CURRENT_IMAGE", "this image")
    alert_topic.publish(
        settings.client("sns"),
        sync.alert_topic_arn,
        "ddb_athena: the platform started - a test alert",
        [
            f"The ddb_athena platform started ({image}). Failed runs, red checks and alarms will come here, as this did.",
            f"The UI: {alert_topic.link(sync.dagster_url, '/')}",
        ],
    )
    print(f"A test alert went to {sync.alert_topic_arn}")
    return 0


def _webserver_arguments(command: argparse.ArgumentParser) -> None:
    """Where the running Dagster webserver is, and whether to follow the run launched through it."""
    command.add_argument(
        "--url", help="the Dagster webserver, e.g. https://dagster.example.com (default: $DDB_ATHENA_DAGSTER_URL, else http://127.0.0.1:$DAGSTER_PORT)"
    )
    command.add_argument(
        "--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_SECONDS, help="seconds to wait for the webserver and its code location to answer"
    )
    command.add_argument("--follow", action="store_true", help="log the run's status until it finishes; exit 1 unless it succeeds")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddb-athena", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    stack = commands.add_parser("local-stack", help="run the AWS emulator (moto) on 127.0.0.1 in the foreground")
    stack.add_argument("--port", type=int, default=LOCAL_STACK_PORT)
    stack.set_defaults(handler=_local_stack)

    init = commands.add_parser("init", help="create the DynamoDB tables and the bucket if missing")
    init.add_argument("--yes", action="store_true", help="required in the aws profile")
    init.set_defaults(handler=_init)

    seed = commands.add_parser("seed", help="insert demo books and orders, and every declared table's seed items (ddb_athena/dev/seeds/)")
    seed.add_argument("--books", type=int, default=50)
    seed.add_argument("--orders", type=int, default=100)
    seed.add_argument("--seed", type=int, default=None)
    seed.set_defaults(handler=_seed)

    simulate = commands.add_parser("simulate", help="write book inserts, updates and deletes (and orders)")
    simulate.add_argument("--rate", type=float, default=2.0, help="operations per second")
    simulate.add_argument("--duration", type=float, default=None, help="seconds (default: until stopped)")
    simulate.add_argument("--operations", type=int, default=None, help="stop after this many writes (default: no limit)")
    simulate.add_argument("--seed", type=int, default=None, help="random seed, for repeatable traffic")
    simulate.add_argument("--books-only", action="store_true", help="books alone: no orders, no seeded table")
    simulate.set_defaults(handler=_simulate)

    query = commands.add_parser("query", help="run Spark SQL against the Iceberg catalog")
    query.add_argument("sql")
    query.add_argument("--format", choices=("table", "json"), default="table")
    query.set_defaults(handler=_query)

    launch = commands.add_parser("launch", help="launch a partitioned job's run through a running Dagster webserver (the instance its UI shows)")
    launch.add_argument("job", help="e.g. orders_daily")
    launch.add_argument("--partition", help="daily partition key, YYYY-MM-DD (default: yesterday, UTC)")
    _webserver_arguments(launch)
    launch.set_defaults(handler=_launch)

    bootstrap = commands.add_parser(
        "bootstrap",
        help="rebuild a streamed table from a scan of DynamoDB (the recovery from a stream gap): queues its <table>_bootstrap "
        "run through the running Dagster webserver; the running sync gives the table up after its cycle and takes it back after",
    )
    bootstrap.add_argument("table", choices=[name for name, table in declared_tables().items() if table.kind == "streamed"])
    _webserver_arguments(bootstrap)
    bootstrap.set_defaults(handler=_bootstrap)

    replay = commands.add_parser("replay-failures", help="capture again the stream batches the capture Lambda gave up on (its on-failure queue)")
    replay.add_argument("--queue-url", help="one queue; default: every queue of DDB_ATHENA_CAPTURE_FAILURE_QUEUE_URLS")
    replay.set_defaults(handler=_replay_failures)

    restore = commands.add_parser(
        "restore-table",
        help="put a table back as it was at a time within the bucket's recovery window (its files and its catalog entry; "
        "docs/operations.md, 'Recovering a table'); stop its sync first",
    )
    restore.add_argument("table", help="the declared table's name (books, orders, ...)")
    restore.add_argument("--to", required=True, help="the time, ISO 8601 with its offset (2026-12-04T10:00:00+00:00)")
    restore.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    restore.set_defaults(handler=_restore_table)

    migrate = commands.add_parser(
        "instance-migrate",
        help="migrate the Dagster instance's schema, a due migration only behind a named database snapshot (the platform runs it at each start)",
    )
    migrate.set_defaults(handler=_instance_migrate)

    test_alert = commands.add_parser("test-alert", help="send a test alert to the alert topic (the platform sends one at each start)")
    test_alert.set_defaults(handler=_test_alert)

    wait = commands.add_parser("wait-for-runs", help="wait until no run of the Dagster instance ($DAGSTER_HOME) is in progress")
    wait.add_argument("--timeout", type=float, default=60, help="seconds; exit 1 if runs are still in progress then")
    wait.set_defaults(handler=_wait_for_runs)

    pools = commands.add_parser(
        "writer-pools",
        help="limit each table writers' pool to one run at a time in the Dagster instance ($DAGSTER_HOME); once, before its daemon starts. "
        "Exit 1 if its dagster.yaml does not queue them (pools granularity run)",
    )
    pools.set_defaults(handler=_writer_pools)

    role = commands.add_parser(
        "database-role",
        help="as the database's master user (DAGSTER_POSTGRES_MASTER_USER and _PASSWORD), make DAGSTER_POSTGRES_USER the instance's "
        "own login, with IAM database authentication, owning its tables (the platform task's database-setup container, at each start)",
    )
    role.set_defaults(handler=_database_role)

    shown = commands.add_parser(
        "settings", help="the sync resource's settings (variable, default, bounds, meaning) as the Markdown table of docs/operations.md"
    )
    shown.set_defaults(handler=_settings)

    end = commands.add_parser(
        "end-runs-left-in-progress",
        help="mark the runs an earlier `make dev` left in progress, their process gone, as failed",
    )
    end.set_defaults(handler=_end_runs_left_in_progress)
    return parser


def _wait_for_runs(args, settings: Settings) -> int:
    from dagster import DagsterInstance

    from ddb_athena.dev.local_runs import runs_in_progress, wait_for_runs_to_end

    with DagsterInstance.get() as instance:
        running = runs_in_progress(instance)
        if running:
            names = ", ".join(f"{run.job_name} {run.run_id[:8]}" for run in running)
            print(f"Waiting up to {args.timeout:g} s for runs to record their end ({names}); Ctrl-C again to stop at once", flush=True)
            running = wait_for_runs_to_end(instance, args.timeout)
        for run in running:
            print(f"Run {run.job_name} {run.run_id} is still in progress; the next `make dev` ends it", file=sys.stderr)
    return 1 if running else 0


def _database_role(args, settings: Settings) -> int:
    from ddb_athena.lib.database_role import connect_as_master, ensure_database_role

    role = os.environ.get("DAGSTER_POSTGRES_USER", "")
    with connect_as_master() as connection:
        changed = ensure_database_role(connection, role)
    connection.close()
    print(f"Role {role} logs in with IAM database authentication and owns the instance's tables: {'; '.join(changed) or 'nothing to change'}")
    return 0


def _writer_pools(args, settings: Settings) -> int:
    from dagster import DagsterInstance

    from ddb_athena.dev.local_runs import limit_writer_pools
    from ddb_athena.lib.writer_lease import WRITER_POOLS
    from ddb_athena.lib.writer_pools import POOLS_SETTING, writer_pool_problems

    with DagsterInstance.get() as instance:
        limit_writer_pools(instance, WRITER_POOLS)
        # The limits alone do not queue the writers: the instance's settings must too, which this command cannot change.
        missing = {problem for pool in WRITER_POOLS for problem in writer_pool_problems(instance, pool)[0]}
    print(f"One run at a time in each writers' pool: {', '.join(WRITER_POOLS)}")
    if missing:
        print(
            f"Yet the writers will not wait in the queue: {'; '.join(sorted(missing))}. Set `{POOLS_SETTING}` in "
            f"$DAGSTER_HOME/dagster.yaml (and no other run_coordinator than the default queue), then restart the daemon.",
            file=sys.stderr,
        )
        return 1
    return 0


def _settings(args, settings: Settings) -> int:
    from ddb_athena.lib.resources import settings_table

    print(settings_table(), end="")
    return 0


def _end_runs_left_in_progress(args, settings: Settings) -> int:
    from dagster import DagsterInstance

    from ddb_athena.dev.local_runs import end_runs_left_in_progress

    with DagsterInstance.get() as instance:
        ended, alive = end_runs_left_in_progress(instance)
    for run in ended:
        print(f"Ended run {run.job_name} {run.run_id}: an earlier stack stopped before it recorded its end")
    for run in alive:
        print(f"Run {run.job_name} {run.run_id} is in progress and its process is alive: left as it is (another stack?)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "rate", 1) <= 0:
        parser.error("--rate must be positive")
    if getattr(args, "operations", None) is not None and args.operations <= 0:
        parser.error("--operations must be positive")
    if not hasattr(args, "url"):
        return args.handler(args, Settings.from_env())
    from dagster_graphql import DagsterGraphQLClientError

    from ddb_athena.dev.launch import Webserver

    try:
        args.webserver = Webserver.at(args.url)
    except ValueError as error:
        parser.error(str(error))
    try:
        return args.handler(args, Settings.from_env())
    except (TimeoutError, DagsterGraphQLClientError) as error:
        # Nothing answered, or Dagster refused the run: one line, not a traceback.
        print(f"ddb-athena {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
