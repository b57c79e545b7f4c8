"""The books sync's bill on AWS, a month, computed from one measurement of `make bench-cost` and the price table
(`prices.py`): every line says what it is made of. No I/O here: `cost.py` measures, this prices.

A measurement's requests are counted by the emulator while the sync runs, by step of the loop and by the files they
touch (`classify`); the few the local stack makes and a deployment does not (Hadoop's catalog and S3A on the
warehouse: directory markers, the version hint, a commit's rename, probes and listings) are kept apart and shown,
not billed. Glue's catalog is not served here (the warehouse uses Hadoop's catalog): its requests are priced from the
commits counted, two each (GetTable, UpdateTable), plus a table load per table every 30 s (Iceberg's catalog cache).
"""

from dataclasses import dataclass, field

from ddb_athena.cleanup.jobs import SMALL_TASK_TAGS
from ddb_athena.lib.resources import SyncSettings
from ddb_athena.lib.settings import DEFAULT_CLEANUP_INTERVAL_SECONDS
from ddb_athena_bench.prices import FIREHOSE_QUOTE_USD_A_MONTH, FREE_TIERS, HOURS_A_MONTH, SECONDS_A_MONTH, SPOT_SHARE_WORSE, price
from ddb_athena_build.templates import LOG_RETENTION_DAYS, deployed_instance

PUT_CLASS = {"PutObject", "CopyObject", "ListObjects", "PostObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"}
GET_CLASS = {"GetObject", "HeadObject"}
FREE = {"DeleteObject", "DeleteObjects"}
# Where the sync's own files live (SourceLayout, lease_record): the line each belongs to.
SOURCE_AREAS = {
    "/changes/": "change files",
    "/_checkpoints/": "checkpoints",
    "/_manifests/": "commit manifests",
    "/_snapshots/": "bootstrap snapshot",
    "/quarantine/": "quarantine",
    "_writer_leases/": "writer lease",
}
# Warehouse requests by the loop's step that made them.
WAREHOUSE_LINES = {
    "merge": "Iceberg commits",
    "capture": "Iceberg commits",
    "compaction": "compaction",
    "pruning": "compaction",
    "maintenance": "maintenance",
    "checks": "checks",
}
GLUE_REQUESTS_PER_COMMIT = 2
GLUE_TABLE_LOADS_PER_MINUTE = 2 * 2  # a streamed table and its tombstones, Iceberg's catalog cache expiring every 30 s
# The run worker's console (CloudWatch Logs with the awslogs driver) a recorded cycle: 10.6 KB for 10 cycles in the
# compute log of a `make dev` sync run (dagster's event lines, the sync's messages).
CONSOLE_BYTES_PER_RECORDED_CYCLE = 1056
# The run's event log a recorded cycle of a table (its materializations and check evaluations, as Dagster stores them):
# 234,981 bytes of events for 23 recorded table-cycles of a sync run (`make bench-interruption`, 29 November: its
# run's SQLite event log). PostgreSQL adds its rows' and indexes' overhead.
EVENT_LOG_BYTES_PER_RECORDED_CYCLE = 10_200
# The capture Lambda (deploy/ddb_athena.yaml): one invocation per shard per batching window while writes arrive,
# 256 MB, each writes one change file.
LAMBDA_BATCHING_WINDOW_SECONDS = 5.0
LAMBDA_MEMORY_GB = 0.25
LAMBDA_SECONDS_PER_INVOCATION = 0.2
# Two sync tasks run at once at each hourly handover: the next run's task starts and warms up beside the running one,
# which then ends after its cycle. Mean of 3 handovers with every run starting 90 s late, an ECS task's slowest start
# (`DDB_ATHENA_SYNC_RUN_MINUTES=3 python -m ddb_athena_bench.freshness --minutes 12 --rate 1 --run-start-delay 90`,
# 27 November).
HANDOVER_OVERLAP_SECONDS = 115.6
# The sync's task-hours a month: always on, and its successor's beside it at each handover.
SYNC_TASK_HOURS = HOURS_A_MONTH * (1 + HANDOVER_OVERLAP_SECONDS / 3600)
# Counted beside each GetRecords call that returned no record.
EMPTY_PAGES = "dynamodbstreams GetRecords-empty"
# Fargate's sizes (vCPU: memory choices in GB).
FARGATE_SIZES = {0.25: (0.5, 1, 2), 0.5: (1, 2, 3, 4), 1: tuple(range(2, 9)), 2: tuple(range(4, 17)), 4: tuple(range(8, 31))}
# A daily key-parity scan reads the table once, eventually consistent (half a read unit per 4 KB).
DAYS_A_MONTH = 30.4
LOG_RETENTION_MONTHS = LOG_RETENTION_DAYS / DAYS_A_MONTH
# Fargate bills a task from its image's pull to its end, a minute at least. Its start (the pull, the process's imports)
# is taken as the slowest an ECS task takes to start, the delay the benches give every run (delayed_location.py).
TASK_START_SECONDS = 90.0
# An upkeep run's process before its pass: the SparkSession's start (its JVM, the Iceberg classes), ~4 s measured
# (PLATFORM.md) and taken as twice that on a task's share of a CPU.
UPKEEP_SPARK_START_SECONDS = 8.0
# The key parity check's own work, a million keys: 61.3 s, of which 26 s the scan's digests unpaced
# (docs/performance-log.md, 2026-11-28); the scan at its pace is added whole (an upper bound).
PARITY_SECONDS_A_MILLION_KEYS = 61.3
# A cleanup run's process once started: its imports (a few CPU-seconds) and the deletes of one batch of manifests.
CLEANUP_SECONDS = 10.0


# The task's options, as the bill prices it (Graviton, the template's default architecture, for every option but x86's).
SPOT = "Spot, Graviton"
SPOT_WORSE = f"Spot at a {SPOT_SHARE_WORSE:g} share, Graviton"


def classify(step: str, kind: str) -> tuple[str, str]:
    """(line, class) of one counted request kind ('<service> <operation> [area] [tag]') made during `step`. Class is
    'PUT' or 'GET' (S3's price classes), 'free', 'not on AWS' (the local stack's own), or the service's call."""
    service, _, rest = kind.partition(" ")
    operation, _, area = rest.partition(" ")
    if service == "dynamodbstreams":
        return ("Streams", "GetRecords" if operation == "GetRecords" else "free")
    if service != "s3":
        return (service, "free")
    if operation in FREE:
        return ("deletes", "free")
    line = next((name for marker, name in SOURCE_AREAS.items() if marker in area or area.startswith(marker)), None)
    if step == "checks":
        line = "checks"
    if line is None:
        line = WAREHOUSE_LINES.get(step, "Iceberg commits")
        # Glue and S3FileIO write each file once, at its name, and know the lengths they read: no marker, no
        # version hint, no rename, no probe or listing of the warehouse (S3FileIO lists only to sweep orphans).
        if area.endswith((" marker", " version-hint")) or operation in ("CopyObject", "HeadObject", "ListObjects"):
            return (line, "not on AWS")
    if area.endswith(" marker"):
        return (line, "not on AWS")
    return (line, "PUT" if operation in PUT_CLASS else "GET" if operation in GET_CLASS else "free")


@dataclass(frozen=True)
class Task:
    vcpu: float
    memory_gb: float

    def __post_init__(self):
        if self.memory_gb not in FARGATE_SIZES.get(self.vcpu, ()):
            raise ValueError(f"Fargate has no task of {self.vcpu:g} vCPU and {self.memory_gb:g} GB")

    def usd(self, arch: str, spot_share: float = 1.0, hours: float = HOURS_A_MONTH) -> float:
        """`hours` of this task, at `spot_share` of the on-demand price."""
        hourly = self.vcpu * price(f"fargate_{arch}_vcpu_hour") + self.memory_gb * price(f"fargate_{arch}_gb_hour")
        return hourly * hours * spot_share

    @property
    def label(self) -> str:
        return f"{self.vcpu:g} vCPU / {self.memory_gb:g} GB"


@dataclass(frozen=True)
class Line:
    name: str
    usd: float
    how: str
    # The quantities it is made of that an always-free allowance covers (price name, units a month): free_column().
    free_units: tuple[tuple[str, float], ...] = ()


@dataclass
class Bill:
    lines: list[Line] = field(default_factory=list)
    task_options: dict[str, float] = field(default_factory=dict)
    not_on_aws: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, usd: float, how: str, free_units: tuple[tuple[str, float], ...] = ()) -> None:
        self.lines.append(Line(name, usd, how, free_units))

    @property
    def without_task(self) -> float:
        return sum(line.usd for line in self.lines)

    def total(self, task_option: str) -> float:
        return self.without_task + self.task_options[task_option]


def month_factor(measured_seconds: float) -> float:
    return SECONDS_A_MONTH / measured_seconds


def price_requests(by_step: dict[str, dict[str, int]]) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """Counts by (line, class) and, apart, the requests not made on AWS, by line."""
    billed: dict[tuple[str, str], int] = {}
    not_on_aws: dict[str, int] = {}
    for step, counts in by_step.items():
        for kind, count in counts.items():
            line, kind_class = classify(step, kind)
            if kind_class == "not on AWS":
                not_on_aws[line] = not_on_aws.get(line, 0) + count
            elif kind_class != "free":
                billed[(line, kind_class)] = billed.get((line, kind_class), 0) + count
    return billed, not_on_aws


def streamed_tables(measurement: dict) -> int:
    """Books and the tables synced beside it in the measured run."""
    return 1 + len(measurement.get("tables_beside", []))


def free_column(lines: list[Line]) -> list[float]:
    """What the account's always-free allowances would cover of each line, taken in order (an allowance covers a
    month once, whichever lines share it): shown beside a bill, never taken off its total."""
    left = {name: allowance for name, (allowance, _) in FREE_TIERS.items()}
    covered = []
    for line in lines:
        usd = 0.0
        for name, units in line.free_units:
            taken = min(units, left.get(name, 0.0))
            left[name] = left.get(name, 0.0) - taken
            usd += taken * price(name)
        covered.append(usd)
    return covered


def _run_task() -> Task:
    """The size of a run without its own `ecs/cpu` and `ecs/memory` tags (deploy/dagster.yaml's run_resources)."""
    resources = deployed_instance()["run_launcher"]["config"]["run_resources"]
    return Task(int(resources["cpu"]) / 1024, int(resources["memory"]) / 1024)


RUN_TASK = _run_task()
SMALL_TASK = Task(int(SMALL_TASK_TAGS["ecs/cpu"]) / 1024, int(SMALL_TASK_TAGS["ecs/memory"]) / 1024)
# stdout and stderr: a run's compute logs.
COMPUTE_LOG_FILES = 2


def billed_task_seconds(work_seconds: float) -> float:
    """What Fargate bills a task whose process works `work_seconds` once started: its start too, a minute at least."""
    return max(60.0, TASK_START_SECONDS + work_seconds)


def short_tasks_usd(task: Task, count: float, work_seconds: float, spot_share: float = 1.0) -> float:
    """`count` tasks of `task` on Graviton, each working `work_seconds`, with their public IPv4 address."""
    hours = count * billed_task_seconds(work_seconds) / 3600
    return task.usd("arm", spot_share, hours) + price("public_ipv4_hour") * hours


def bill(measurement: dict, task: Task, capture: str = "run") -> Bill:
    """USD a month of the books sync as measured (`cost.measure_cell`), on a task of `task`'s size; with
    `capture='lambda'` the stream is read by the capture Lambda instead (modelled from the same measurement)."""
    factor = month_factor(measurement["measured_seconds"])
    billed, not_on_aws = price_requests(measurement["requests_by_step"])
    result = Bill()
    with_handovers = SYNC_TASK_HOURS / HOURS_A_MONTH
    result.task_options = {
        "on demand, x86": task.usd("x86") * with_handovers,
        "on demand, Graviton": task.usd("arm") * with_handovers,
        SPOT: task.usd("arm", price("fargate_spot_share")) * with_handovers,
        SPOT_WORSE: task.usd("arm", SPOT_SHARE_WORSE) * with_handovers,
    }
    result.add("public IPv4 (the task's address)", price("public_ipv4_hour") * HOURS_A_MONTH * with_handovers, "one address, always on, two at a handover")
    # Each table beside books has a stream of its own, of one shard at a few writes a second.
    shards = measurement["shards"] + streamed_tables(measurement) - 1
    lambda_invocations = shards * SECONDS_A_MONTH / LAMBDA_BATCHING_WINDOW_SECONDS
    for (line, kind_class), count in sorted(billed.items()):
        if line == "Streams":
            if capture == "run":
                empty = measurement["requests_by_step"].get("capture", {}).get(EMPTY_PAGES, 0)
                result.add(
                    "Streams GetRecords",
                    count * factor * price("streams_get_records"),
                    f"{count * factor:,.0f} calls ({empty / max(count, 1):.0%} empty pages)",
                    (("streams_get_records", count * factor),),
                )
            continue
        if capture == "lambda" and line in ("change files", "checkpoints") and kind_class == "PUT":
            continue  # the Lambda writes the change files; it keeps no checkpoint
        monthly = count * factor
        result.add(f"S3 {kind_class} requests: {line}", monthly * price(f"s3_{kind_class.lower()}_class"), f"{monthly:,.0f} requests")
    if capture == "lambda":
        gb_seconds = lambda_invocations * LAMBDA_SECONDS_PER_INVOCATION * LAMBDA_MEMORY_GB
        result.add(
            "capture Lambda",
            lambda_invocations * price("lambda_request") + gb_seconds * price("lambda_arm_gb_second"),
            f"{lambda_invocations:,.0f} invocations ({shards} shards, a {LAMBDA_BATCHING_WINDOW_SECONDS:g}-s batching window), "
            f"{LAMBDA_SECONDS_PER_INVOCATION:g} s of {LAMBDA_MEMORY_GB * 1024:.0f} MB each (modelled)",
            (("lambda_request", lambda_invocations), ("lambda_arm_gb_second", gb_seconds)),
        )
        result.add("S3 PUT requests: change files (the Lambda's)", lambda_invocations * price("s3_put_class"), f"{lambda_invocations:,.0f} files")
        # The Lambda's change files are deleted once merged: a cleanup run (a task of Fargate's smallest size, on the
        # runs' capacity) every cleanup interval while writes arrive.
        cleanups = SECONDS_A_MONTH / DEFAULT_CLEANUP_INTERVAL_SECONDS
        result.add(
            "cleanup runs' tasks",
            short_tasks_usd(SMALL_TASK, cleanups, CLEANUP_SECONDS, price("fargate_spot_share")),
            f"{cleanups:,.0f} tasks of {SMALL_TASK.label} on Spot, {billed_task_seconds(CLEANUP_SECONDS):.0f} s each with their address "
            f"(a start of {TASK_START_SECONDS:g} s, modelled)",
        )
    commits = measurement["iceberg_commits"] * factor
    glue = GLUE_REQUESTS_PER_COMMIT * commits + GLUE_TABLE_LOADS_PER_MINUTE * streamed_tables(measurement) * SECONDS_A_MONTH / 60
    result.add(
        "Glue Data Catalog",
        glue * price("glue_request"),
        f"{glue:,.0f} requests ({commits:,.0f} commits, 2 each, and table loads; modelled)",
        (("glue_request", glue),),
    )
    result.add(
        "S3 storage",
        measurement["stored_bytes"] / 1e9 * price("s3_storage_gb_month"),
        f"{measurement['stored_bytes'] / 1e9:.2f} GB: the table, retained snapshots, staging",
    )
    logs_gb = measurement["recorded_cycles"] * streamed_tables(measurement) * factor * CONSOLE_BYTES_PER_RECORDED_CYCLE / 1e9
    result.add(
        "CloudWatch Logs",
        logs_gb * (price("cloudwatch_logs_ingest_gb") + LOG_RETENTION_MONTHS * price("cloudwatch_logs_storage_gb_month")),
        f"{logs_gb:.2f} GB of the run worker's console, kept {LOG_RETENTION_DAYS} days",
        (("cloudwatch_logs_ingest_gb", logs_gb),),
    )
    # The same lines in the run's compute logs (deploy/dagster.yaml): the files uploaded whole every upload interval
    # while the run lives, kept as long (the bucket's lifecycle rule).
    upload_interval = deployed_instance()["compute_logs"]["config"]["upload_interval"]
    uploads = COMPUTE_LOG_FILES * SECONDS_A_MONTH / upload_interval
    result.add(
        "compute logs in S3",
        uploads * price("s3_put_class") + logs_gb * LOG_RETENTION_MONTHS * price("s3_storage_gb_month"),
        f"{uploads:,.0f} uploads (stdout and stderr every {upload_interval} s), {logs_gb:.2f} GB kept {LOG_RETENTION_DAYS} days",
    )
    # The same cycles' events in the instance's PostgreSQL, kept until runs are deleted: they fill its storage (priced
    # with the platform, a fixed size) rather than the month's bill.
    event_log_gb = measurement["recorded_cycles"] * streamed_tables(measurement) * factor * EVENT_LOG_BYTES_PER_RECORDED_CYCLE / 1e9
    result.add(
        "the run's event log in PostgreSQL",
        0.0,
        f"{event_log_gb:.2f} GB more a month, kept: the platform's {PLATFORM_DATABASE_GB} GB hold {PLATFORM_DATABASE_GB / event_log_gb:.0f} months of it",
    )
    read_units = measurement["table_bytes"] / 4096 * 0.5 * DAYS_A_MONTH
    result.add("DynamoDB reads of the daily key parity scan", read_units * price("dynamodb_read_unit"), f"{read_units:,.0f} read units")
    # Each streamed table's daily key parity check is a run, so a task (the runs' default size, regular Fargate).
    pace = SyncSettings.model_fields["parity_scan_read_units_per_second"].default
    books_seconds = measurement["items"] / 1e6 * PARITY_SECONDS_A_MILLION_KEYS + measurement["table_bytes"] / 4096 * 0.5 / pace
    parity_usd = short_tasks_usd(RUN_TASK, DAYS_A_MONTH, books_seconds) + short_tasks_usd(RUN_TASK, DAYS_A_MONTH * (streamed_tables(measurement) - 1), 0.0)
    result.add(
        "key parity runs' tasks",
        parity_usd,
        f"{streamed_tables(measurement)} a day of {RUN_TASK.label}, on demand, with their address; books' {billed_task_seconds(books_seconds):.0f} s "
        f"(a start of {TASK_START_SECONDS:g} s, {PARITY_SECONDS_A_MILLION_KEYS:g} s a million keys, the scan at {pace:g} read units a second; modelled)",
    )
    upkeep = measurement.get("upkeep_run")
    if upkeep is not None:
        # One upkeep run for every streamed table (expiry, orphans: beside the sync) every maintenance interval, on Spot:
        # a pass each, books' measured (a small table's is no longer: the same snapshots, fewer files).
        runs = SECONDS_A_MONTH / (measurement["maintenance_interval_minutes"] * 60)
        work = UPKEEP_SPARK_START_SECONDS + upkeep["seconds"] * streamed_tables(measurement)
        result.add(
            "upkeep runs' tasks",
            short_tasks_usd(RUN_TASK, runs, work, price("fargate_spot_share")),
            f"{runs:,.0f} tasks of {RUN_TASK.label} on Spot, {billed_task_seconds(work):.0f} s each with their address (a start of "
            f"{TASK_START_SECONDS:g} s and the SparkSession's {UPKEEP_SPARK_START_SECONDS:g} s modelled, a pass measured per table)",
        )
    result.add("freshness checks", 0.0, "evaluated by the daemon's sensor from the sync's own records: no run, no task")
    result.not_on_aws = {line: count * factor for line, count in not_on_aws.items()}
    return result


# Every job a schedule or a sensor starts, by the ending of its name, and where its tasks are priced: a test holds this
# complete against the definitions, so a run added to the steady state is priced or fails it. (The freshness and
# alert sensors start none: the daemon evaluates them.)
PRICED_RUNS = {
    "_sync": "the task, always on (its successor's task beside it at the hourly handover, "
    f"{HANDOVER_OVERLAP_SECONDS:.0f} s an hour, and at each Spot interruption: sync_successor_on_interruption)",
    "_key_parity": "key parity runs' tasks (a daily schedule per streamed table)",
    "_upkeep": "upkeep runs' tasks (the upkeep_when_due sensor, one run for every streamed table each maintenance interval)",
    "_source_cleanup": "cleanup runs' tasks: with the capture Lambda only (the sync's own capture keeps its change files on its disk)",
    "_daily": "orders' daily export and load: cost-orders-and-alternatives.md",
    "_export_cleanup": "orders' daily export and load: cost-orders-and-alternatives.md (one cleanup a day)",
}


def priced_as(job_name: str) -> str | None:
    return next((line for ending, line in PRICED_RUNS.items() if job_name.endswith(ending)), None)


# The lines a cycle cannot do without while the guarantees hold (per-key order, deletes that never resurrect, one
# writer fenced in the commit): the task (priced apart) and its address, the commits (the MERGE's files and
# manifests, the tombstones', the fence's publications) with their Glue requests, the stream's reads, the table's
# storage and the daily parity scan. Upkeep, checks, logs and the lease are left out: the floor is what no tuning of
# them can go under.
FLOOR_LINES = (
    "public IPv4 (the task's address)",
    "S3 PUT requests: Iceberg commits",
    "S3 GET requests: Iceberg commits",
    "Glue Data Catalog",
    "Streams GetRecords",
    "S3 storage",
    "DynamoDB reads of the daily key parity scan",
)


def floor_usd(result: Bill, task_option: str) -> float:
    """The bill of a measured cell with only its FLOOR_LINES and its task."""
    return result.task_options[task_option] + sum(line.usd for line in result.lines if line.name in FLOOR_LINES)


@dataclass(frozen=True)
class Target:
    task_option: str
    usd: float
    p95_seconds: float

    @property
    def label(self) -> str:
        return f"{self.usd:g} USD {'on Spot' if self.task_option == SPOT else 'on demand'} at p95 <= {self.p95_seconds:g} s"


# The project's goals for books' own line on Graviton at 230 writes a second (the requirement asks for a minute or two):
# the default (Spot, on demand where Spot has no capacity) under 20 USD within a minute, a row within 30 s under 30 USD,
# and on demand under the Firehose quote within a minute.
TARGETS = (Target(SPOT, 20.0, 60.0), Target(SPOT, 30.0, 30.0), Target("on demand, Graviton", FIREHOSE_QUOTE_USD_A_MONTH, 60.0))


def against_targets(result: Bill, p95_seconds: float, total=None) -> str:
    """Each target the cell's p95 is within, met or missed: 'meets 20 USD on Spot at p95 <= 60 s; misses ...'.
    `total(result, task_option)` prices the cell (default: its whole bill)."""
    total = total or (lambda bill, option: bill.total(option))
    within = [target for target in TARGETS if p95_seconds <= target.p95_seconds]
    verdicts = [f"{'meets' if total(result, target.task_option) <= target.usd else 'misses'} {target.label}" for target in within]
    return "; ".join(verdicts) or f"too slow for every target (p95 over {max(target.p95_seconds for target in TARGETS):g} s)"


# Dagster itself (deploy/dagster_ecs.yaml: webserver, daemon and code server in one task; its PostgreSQL), shared by
# every table, in its smallest honest shape: the three held ~500 MiB and ~5% of a core with the schedules ticking.
PLATFORM_TASK = Task(0.25, 1)
PLATFORM_DATABASE_GB = 20
# The image a deployment runs (deploy/Dockerfile), gzip-compressed as ECR stores its layers: 914,228,875 bytes built
# here (`make test-image`'s build, then `docker save | gzip | wc -c`, 29 November) on the local Debian base and
# without Iceberg's AWS bundle (Maven Central is out of reach here; the bundle is a few tens of MB).
IMAGE_GB = 0.91
# The platform container's own log (webserver, daemon and code server at INFO: every schedule tick and sensor
# evaluation), bytes a minute: 64,493 bytes in 15.5 minutes of `make bench-interruption`'s dagster.log, its runs'
# lines left out (they are the runs' own logs), 29 November.
PLATFORM_LOG_BYTES_A_MINUTE = 4_160


# The platform stack's CloudWatch alarms (deploy/dagster_ecs.yaml): no platform task, the database's storage and credits.
PLATFORM_ALARMS = 3
# The data stack's alarm on alerts SNS could not deliver (deploy/ddb_athena.yaml), shared like the platform's.
ALERT_DELIVERY_ALARMS = 1
# The platform task's starts a month the bill allows for (deployments, a replaced task): ECS reads the master
# password into its database-setup container at each; the runs read none (they log in with IAM tokens).
PLATFORM_STARTS_A_MONTH = 30


def platform_bill() -> list[Line]:
    """Dagster's part of the bill, shared by every table: its task, its database and the database's secret, its
    logs and alarms, the image every task pulls."""
    secret_reads = PLATFORM_STARTS_A_MONTH
    logs_gb = PLATFORM_LOG_BYTES_A_MINUTE * 60 * HOURS_A_MONTH / 1e9
    return [
        Line(f"Dagster webserver, daemon and code server, {PLATFORM_TASK.label} Graviton task", PLATFORM_TASK.usd("arm"), "730 hours, on demand"),
        Line("its public IPv4 address", price("public_ipv4_hour") * HOURS_A_MONTH, "730 hours"),
        Line(
            "its log in CloudWatch",
            logs_gb * (price("cloudwatch_logs_ingest_gb") + LOG_RETENTION_MONTHS * price("cloudwatch_logs_storage_gb_month")),
            f"{logs_gb:.2f} GB a month, kept {LOG_RETENTION_DAYS} days",
            (("cloudwatch_logs_ingest_gb", logs_gb),),
        ),
        Line("PostgreSQL: RDS db.t4g.micro, single-AZ", price("rds_postgres_t4g_micro_hour") * HOURS_A_MONTH, "730 hours"),
        Line(f"its storage, {PLATFORM_DATABASE_GB} GB gp3", PLATFORM_DATABASE_GB * price("rds_gp3_gb_month"), "7 days of backups: free up to the storage"),
        Line(
            "its master password: an RDS-managed secret",
            price("secrets_manager_secret_month") + secret_reads * price("secrets_manager_call"),
            f"one secret; read at each platform start ({secret_reads} allowed for a month); the instance logs in with IAM tokens",
        ),
        Line(
            "alarms on the platform task, the database and the alerts' delivery",
            (PLATFORM_ALARMS + ALERT_DELIVERY_ALARMS) * price("cloudwatch_alarm_month"),
            f"{PLATFORM_ALARMS + ALERT_DELIVERY_ALARMS} alarms; the stopped-task rule (EventBridge, AWS events), the database's "
            "event subscription and Session Manager are free",
            (("cloudwatch_alarm_month", PLATFORM_ALARMS + ALERT_DELIVERY_ALARMS),),
        ),
        Line("the image in ECR", IMAGE_GB * price("ecr_storage_gb_month"), f"{IMAGE_GB:.2f} GB compressed, one version kept; pulls in the region are free"),
    ]


# A NAT gateway's traffic: every stream record crosses it (Streams has no gateway endpoint), both images of an update.
STREAM_IMAGES_A_RECORD = 2


def nat_alternative(measurement: dict, task_option_hours: float) -> list[Line]:
    """What private subnets behind one NAT gateway (AssignPublicIp=DISABLED) change a month against the template's public
    subnets: the gateway, its address and its traffic, less the tasks' own addresses (`task_option_hours` of the sync's
    task, the platform's 730). The S3 and DynamoDB gateway endpoints keep the commits and scans off it; Streams, Glue,
    ECR's API and CloudWatch go through it."""
    item_bytes = measurement["table_bytes"] / max(measurement["items"], 1)
    stream_gb = measurement["rate"] * STREAM_IMAGES_A_RECORD * item_bytes * SECONDS_A_MONTH / 1e9
    return [
        Line("NAT gateway, one Availability Zone", price("nat_gateway_hour") * HOURS_A_MONTH, "730 hours"),
        Line("its public IPv4 address", price("public_ipv4_hour") * HOURS_A_MONTH, "730 hours"),
        Line(
            "the stream's records through it",
            stream_gb * price("nat_gateway_gb"),
            f"{stream_gb:,.0f} GB: {measurement['rate']:g} writes a second of {item_bytes:,.0f} bytes, both images (at most)",
        ),
        Line(
            "no address for the sync's and the platform's tasks",
            -price("public_ipv4_hour") * (task_option_hours + HOURS_A_MONTH),
            f"{task_option_hours + HOURS_A_MONTH:,.0f} address-hours",
        ),
    ]
