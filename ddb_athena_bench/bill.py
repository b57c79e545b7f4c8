"""The books sync's bill on AWS, a month, computed from one measurement of `make bench-cost` and the price table
(`prices.py`): every line says what it is made of. No I/O here: `cost.py` measures, this prices.

A measurement's requests are counted by the emulator while the sync runs, by step of the loop and by the files they
touch (`classify`); the few the local stack makes and a deployment does not (Hadoop's catalog and S3A on the
warehouse: directory markers, the version hint, a commit's rename, probes and listings) are kept apart and shown,
not billed. Glue's catalog is not served here (the warehouse uses Hadoop's catalog): its requests are priced from the
commits counted, two each (GetTable, UpdateTable), plus a table load per table every 30 s (Iceberg's catalog cache).
"""

from dataclasses import dataclass, field

from ddb_athena_bench.prices import FIREHOSE_QUOTE_USD_A_MONTH, HOURS_A_MONTH, SECONDS_A_MONTH, price

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
WAREHOUSE_LINES = {"merge": "Iceberg commits", "capture": "Iceberg commits", "compaction": "compaction", "maintenance": "maintenance", "checks": "checks"}
GLUE_REQUESTS_PER_COMMIT = 2
GLUE_TABLE_LOADS_PER_MINUTE = 2 * 2  # a streamed table and its tombstones, Iceberg's catalog cache expiring every 30 s
# The run worker's console (CloudWatch Logs with the awslogs driver) a recorded cycle: 10.6 KB for 10 cycles in the
# compute log of a `make dev` sync run (dagster's event lines, the sync's messages).
CONSOLE_BYTES_PER_RECORDED_CYCLE = 1056
LOG_RETENTION_MONTHS = 1.0
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
# Counted beside each GetRecords call that returned no record.
EMPTY_PAGES = "dynamodbstreams GetRecords-empty"
# Fargate's sizes (vCPU: memory choices in GB).
FARGATE_SIZES = {0.25: (0.5, 1, 2), 0.5: (1, 2, 3, 4), 1: tuple(range(2, 9)), 2: tuple(range(4, 17)), 4: tuple(range(8, 31))}
# A daily key-parity scan reads the table once, eventually consistent (half a read unit per 4 KB).
DAYS_A_MONTH = 30.4


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

    def usd(self, arch: str, spot: bool = False) -> float:
        hourly = self.vcpu * price(f"fargate_{arch}_vcpu_hour") + self.memory_gb * price(f"fargate_{arch}_gb_hour")
        return hourly * HOURS_A_MONTH * (price("fargate_spot_share") if spot else 1.0)

    @property
    def label(self) -> str:
        return f"{self.vcpu:g} vCPU / {self.memory_gb:g} GB"


@dataclass
class Bill:
    lines: list[tuple[str, float, str]] = field(default_factory=list)
    task_options: dict[str, float] = field(default_factory=dict)
    not_on_aws: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, usd: float, how: str) -> None:
        self.lines.append((name, usd, how))

    @property
    def without_task(self) -> float:
        return sum(usd for _, usd, _ in self.lines)

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


def bill(measurement: dict, task: Task, capture: str = "run") -> Bill:
    """USD a month of the books sync as measured (`cost.measure_cell`), on a task of `task`'s size; with
    `capture='lambda'` the stream is read by the capture Lambda instead (modelled from the same measurement)."""
    factor = month_factor(measurement["measured_seconds"])
    billed, not_on_aws = price_requests(measurement["requests_by_step"])
    result = Bill()
    with_handovers = 1 + HANDOVER_OVERLAP_SECONDS / 3600
    result.task_options = {
        "on demand, x86": task.usd("x86") * with_handovers,
        "on demand, Graviton": task.usd("arm") * with_handovers,
        "Spot, Graviton": task.usd("arm", spot=True) * with_handovers,
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
        )
        result.add("S3 PUT requests: change files (the Lambda's)", lambda_invocations * price("s3_put_class"), f"{lambda_invocations:,.0f} files")
    commits = measurement["iceberg_commits"] * factor
    glue = GLUE_REQUESTS_PER_COMMIT * commits + GLUE_TABLE_LOADS_PER_MINUTE * streamed_tables(measurement) * SECONDS_A_MONTH / 60
    result.add("Glue Data Catalog", glue * price("glue_request"), f"{glue:,.0f} requests ({commits:,.0f} commits, 2 each, and table loads; modelled)")
    result.add(
        "S3 storage",
        measurement["stored_bytes"] / 1e9 * price("s3_storage_gb_month"),
        f"{measurement['stored_bytes'] / 1e9:.2f} GB: the table, retained snapshots, staging",
    )
    logs_gb = measurement["recorded_cycles"] * streamed_tables(measurement) * factor * CONSOLE_BYTES_PER_RECORDED_CYCLE / 1e9
    result.add(
        "CloudWatch Logs",
        logs_gb * (price("cloudwatch_logs_ingest_gb") + LOG_RETENTION_MONTHS * price("cloudwatch_logs_storage_gb_month")),
        f"{logs_gb:.2f} GB of the run worker's console",
    )
    read_units = measurement["table_bytes"] / 4096 * 0.5 * DAYS_A_MONTH
    result.add("DynamoDB reads of the daily key parity scan", read_units * price("dynamodb_read_unit"), f"{read_units:,.0f} read units")
    result.not_on_aws = {line: count * factor for line, count in not_on_aws.items()}
    return result


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
    return result.task_options[task_option] + sum(usd for name, usd, _ in result.lines if name in FLOOR_LINES)


def within_target(total_usd: float, p95_seconds: float) -> str:
    """Against the issue's targets at 230 writes a second: under the Firehose quote at p95 <= 30 s, under 20 USD at
    p95 <= 120 s."""
    if p95_seconds <= 30:
        return "meets" if total_usd <= FIREHOSE_QUOTE_USD_A_MONTH else "misses"
    if p95_seconds <= 120:
        return "meets" if total_usd <= 20 else "misses"
    return "too slow"


# Dagster itself (deploy/dagster_ecs.yaml: webserver, daemon and code server in one task; its PostgreSQL), shared by
# every table, in its smallest honest shape: the three held ~500 MiB and ~5% of a core with the schedules ticking.
PLATFORM_TASK = Task(0.25, 1)
PLATFORM_DATABASE_GB = 20


def platform_bill() -> list[tuple[str, float, str]]:
    return [
        (f"Dagster webserver, daemon and code server, {PLATFORM_TASK.label} Graviton task", PLATFORM_TASK.usd("arm"), "730 hours, on demand"),
        ("its public IPv4 address", price("public_ipv4_hour") * HOURS_A_MONTH, "730 hours"),
        ("PostgreSQL: RDS db.t4g.micro, single-AZ", price("rds_postgres_t4g_micro_hour") * HOURS_A_MONTH, "730 hours"),
        (f"its storage, {PLATFORM_DATABASE_GB} GB gp3", PLATFORM_DATABASE_GB * price("rds_gp3_gb_month"), "a month"),
    ]
