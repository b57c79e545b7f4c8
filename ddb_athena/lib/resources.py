"""Dagster resources: AWS clients, the Iceberg-configured SparkSession, the sync settings, and where the orders load runs."""

import functools
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

import boto3
from botocore.config import Config
from dagster import ConfigurableResource
from dagster_aws.utils import ResourceWithBoto3Configuration
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from ddb_athena.lake.class_lookups import keep_class_lookups
from ddb_athena.lake.identifiers import qualified_name
from ddb_athena.lake.local_jars import aws_profile_jar_paths, local_file_system_jar, local_jar_paths, spark_class_archive
from ddb_athena.lake.session_config import SparkIcebergOptions, iceberg_spark_config, python_workers_from, runs_in_this_process, sigint_handler_kept
from ddb_athena.lib.declarations import MAX_MERGE_INTERVAL_SECONDS, MIN_MERGE_INTERVAL_SECONDS, TableDeclaration, declared_tables
from ddb_athena.lib.settings import (
    DEFAULT_LONGEST_MERGE_INTERVAL_SECONDS,
    DEFAULT_MERGE_INTERVAL_SECONDS,
    DEFAULT_SYNC_RUN_MINUTES,
    DEFAULT_WRITER_LEASE_SECONDS,
    DEFAULT_WRITER_STALL_SECONDS,
    MAX_SYNC_RUN_MINUTES,
    MAX_WRITER_LEASE_SECONDS,
    MAX_WRITER_STALL_SECONDS,
    MIN_WRITER_LEASE_SECONDS,
    MIN_WRITER_STALL_SECONDS,
    SETTING_PREFIX,
    DeploymentVariables,
    ExportedTableSettings,
    Settings,
    SettingsError,
    fields_table,
    from_variables,
)
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.lib.writer_lease import WriterLease

# Building a boto3 Session parses botocore's endpoint and model files (~0.13 CPU-s each): one per set of credentials in
# the process, not one per client and run. A Session is not thread-safe; its clients are, once built (under this lock,
# which also keeps a run to one client per service).
_CLIENT_CREATION = threading.Lock()


@functools.cache
def _boto3_session(profile_name: str | None, access_key_id: str | None, secret_access_key: str | None, session_token: str | None, region_name: str | None):
    return boto3.session.Session(
        profile_name=profile_name,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        aws_session_token=session_token,
        region_name=region_name,
    )


class AwsClientsResource(ResourceWithBoto3Configuration):
    """boto3 clients for DynamoDB, DynamoDB Streams and S3, from one configuration, one per service."""

    _clients: dict = PrivateAttr(default_factory=dict)

    def client(self, service: str):
        # boto3 clients are thread-safe and costly to build; assets and checks of a run share them.
        with _CLIENT_CREATION:
            if service not in self._clients:
                self._clients[service] = self._new_client(service)
            return self._clients[service]

    def _new_client(self, service: str):
        session = _boto3_session(self.profile_name, self.aws_access_key_id, self.aws_secret_access_key, self.aws_session_token, self.region_name)
        return session.client(
            service,
            endpoint_url=self.endpoint_url,
            use_ssl=self.use_ssl,
            verify=self.verify,
            config=Config(retries={"max_attempts": self.max_attempts, "mode": "standard"}),
        )


class WriterLeases(ConfigurableResource):
    """The writer lease of each table a run writes (ddb_athena/lib/writer_lease.py): taken before the run's first write
    to the table, renewed while the run lives, released when the run ends. Dagster's pools keep this instance's runs
    from overlapping; the lease also stops writers the pools cannot see (the CLI's in-process runs, another instance)."""

    ttl_seconds: float = Field(
        default=DEFAULT_WRITER_LEASE_SECONDS,
        ge=MIN_WRITER_LEASE_SECONDS,
        le=MAX_WRITER_LEASE_SECONDS,
        description="a writer renews its lease a few times within this; a dead writer's lease expires this long after "
        "its last renewal. A run waits twice this for another writer's lease (long enough for a dead writer's to "
        "expire), then stops with a message naming that writer",
    )
    stall_seconds: float = Field(
        default=DEFAULT_WRITER_STALL_SECONDS,
        ge=MIN_WRITER_STALL_SECONDS,
        le=MAX_WRITER_STALL_SECONDS,
        description="a writer that makes no progress this long (no step of its own, no Spark task completed) stops "
        "renewing its lease, which then expires: a hung run does not hold its table",
    )
    _held: dict = PrivateAttr(default_factory=dict)

    def hold(self, context, s3, bucket: str, table: str, progress: Callable[[], object] = lambda: None, wait_seconds: float | None = None) -> WriterLease:
        """This run's lease of `table`, taken on first use (waiting up to `wait_seconds`, by default twice its time to
        live). `progress` tells the lease that work goes on between the run's steps (e.g.
        `IcebergSparkResource.tasks_in_progress`)."""
        if table not in self._held:
            holder = f"Dagster run {context.run.run_id} ({context.run.job_name})"
            lease = WriterLease(s3, bucket, table, holder, self.ttl_seconds, stall_seconds=self.stall_seconds, progress=progress)
            context.log.info(f"Taking the writer lease of {table} (s3://{bucket}/{lease.key})")
            lease.acquire(wait_seconds)
            context.log.info(f"Took the writer lease of {table}")
            self._held[table] = lease
        return self._held[table]

    def release(self, table: str) -> None:
        """Gives one table's lease up before the run ends (another writer waits for it)."""
        lease = self._held.pop(table, None)
        if lease is not None:
            lease.release()

    def teardown_after_execution(self, context) -> None:
        for lease in self._held.values():
            lease.release()
        self._held.clear()


class IcebergSparkResource(ConfigurableResource):
    """One SparkSession per run (created on first use), configured for the Iceberg catalog.

    Built on dagster-pyspark's LazyPySparkResource; `jars_packages` switches from the local
    JARs to Maven coordinates (`spark.jars.packages`) where Maven is reachable.
    """

    profile: str = Field(description="local (Hadoop catalog, S3 emulator) or aws (Glue catalog)")
    warehouse: str = Field(description="Iceberg warehouse URI")
    catalog: str = Field(default="lake", description="Spark catalog name; it is the default catalog")
    master: str | None = Field(default="local[2]", description="spark.master; None on a cluster")
    jars_packages: str | None = Field(default=None, description="spark.jars.packages instead of local JARs")
    s3_endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    extra_config: dict[str, str] = Field(default_factory=dict, description="any further Spark settings")
    _pyspark: LazyPySparkResource | None = PrivateAttr(default=None)

    def spark_config(self, with_credentials: bool = True) -> dict[str, str]:
        """With `with_credentials=False`, S3A finds the credentials in the environment (see credential_environment)."""
        jars: list = []
        file_system_jar = class_archive = None
        if self.profile == "local":
            jars = [] if self.jars_packages else local_jar_paths()
            file_system_jar = local_file_system_jar()
            class_archive = spark_class_archive()
        elif runs_in_this_process(self.master) and not self.jars_packages:
            # An image's baked JARs; without them (a laptop), Maven's (session_config.RUN_WORKER_AWS_PACKAGES).
            jars = aws_profile_jar_paths() or []
        credentials = self.credential_environment() if with_credentials else {}
        return iceberg_spark_config(
            SparkIcebergOptions(
                profile=self.profile,
                warehouse=self.warehouse,
                catalog=self.catalog,
                master=self.master,
                jars=[str(jar) for jar in jars],
                jars_packages=self.jars_packages,
                local_file_system_jar=str(file_system_jar) if file_system_jar else None,
                class_archive=str(class_archive) if class_archive else None,
                s3_endpoint_url=self.s3_endpoint_url,
                region=self.region,
                credentials=credentials,
                extra=self.extra_config,
            )
        )

    def credential_environment(self) -> dict[str, str]:
        """The configured keys as the environment variables AWS SDKs read; empty when the default chain applies."""
        if self.access_key_id and self.secret_access_key:
            return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        return {}

    @property
    def spark_session(self) -> SparkSession:
        if self._pyspark is None:
            config = self.spark_config()
            pyspark = LazyPySparkResource(spark_config=config)
            with sigint_handler_kept(), python_workers_from(config):
                _ = pyspark.spark_session  # created here, once: PySpark replaces the SIGINT handler as it does
            keep_class_lookups(pyspark.spark_session)
            self._pyspark = pyspark
        return self._pyspark.spark_session

    @property
    def session_started(self) -> bool:
        return self._pyspark is not None

    def activate_in_this_thread(self) -> None:
        """Makes the session this thread's active one in the JVM: a thread of its own otherwise plans its queries with
        another session's settings (SQLConf is read from the thread's active session), its catalogs among them."""
        session = self.spark_session
        session._jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)

    def tasks_in_progress(self) -> tuple:
        """The active Spark stages and the tasks each has completed; empty before the session exists (not created
        here). What a writer's lease watches for progress during a long Spark job."""
        if self._pyspark is None:
            return ()
        tracker = self._pyspark.spark_session.sparkContext.statusTracker()
        stages = (tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds())
        return tuple((stage.stageId, stage.numCompletedTasks) for stage in stages if stage is not None)

    @property
    def source_scheme(self) -> str:
        """s3a:// through Hadoop locally; s3:// on EMR and Glue, whose file systems own that scheme."""
        return "s3a" if self.profile == "local" else "s3"


# What a new on-demand table serves at first (AWS's documented initial read throughput): the parity scan stays below.
MAX_PARITY_SCAN_READ_UNITS_PER_SECOND = 12_000


class SyncSettings(ConfigurableResource):
    """The settings of every run, each declared once here (default, bounds, meaning): read from DDB_ATHENA_<FIELD> for
    the runs the schedules and sensors start (`sync_settings`), editable per run in the launchpad, but for where the
    tables are (`setup_for_execution`)."""

    bucket: str
    dynamodb_tables: dict[str, str] = Field(
        default_factory=dict,
        description="the DynamoDB table of each declared table (ddb_athena/tables.toml), by its name; unset: the declared dynamodb_table",
    )
    namespace: str = Field(default="library", description="Iceberg namespace (the Glue database on AWS)")
    books_capture: Literal["run", "lambda"] = Field(
        default="run",
        description="who reads the stream of every streamed table whose declaration names no capture: the sync run itself, or "
        "the capture Lambda (the data stack's BooksCapture, deploy/ddb_athena.yaml)",
    )
    capture_failure_queue_urls: dict[str, str] = Field(
        default_factory=dict,
        description="the capture Lambda's on-failure queue of each streamed table, by its name, as JSON (the stack's "
        "CaptureFailureQueueUrls): batches it gave up on, which turn that table's <name>_capture_failures red until "
        "`ddb-athena replay-failures` captures them again or a bootstrap covers them",
    )
    alert_topic_arn: str | None = Field(
        default=None,
        pattern=r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}$",
        description="the SNS topic a failed run or a check turning red is published to, once an incident (the data stack's AlertTopicArn); unset: no alerts",
    )
    dagster_url: str | None = Field(
        default=None, description="the Dagster webserver's URL, for the links in alerts (and the CLI's --url); unset: links are paths"
    )
    run_capacity: Literal["FARGATE_SPOT", "FARGATE"] = Field(
        default="FARGATE_SPOT",
        description="on ECS, the capacity of the sync's and the cleanups' tasks: FARGATE_SPOT (50-70% off; ECS stopping one costs "
        "a handover brought forward and a gap of about two minutes, streamed/handover.py) or FARGATE; a task Spot cannot place goes "
        "on FARGATE, saying so (lib/ecs_launcher.py)",
    )
    cleanup_role_arn: str | None = Field(
        default=None,
        pattern=r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}$",
        description="on ECS, the role of the cleanup runs' tasks (the data stack's DagsterCleanupRole: it deletes source files, never a "
        "warehouse file); unset: they take the runs' role",
    )
    backlog_limit_minutes: float = Field(
        default=2.0, ge=0, description="oldest unmerged change file allowed, in minutes (a table declared with a longer interval: two of them)"
    )
    merge_buffer_changes: int = Field(
        default=1000,
        ge=1,
        description="a table declared with a merge interval longer than the run's merges at the run's interval once its changes "
        "come fast enough to reach this many by then (size or time, whichever first, as Firehose's buffering hints): quiet, it "
        "commits once its own interval; busy, it is as fresh as the run",
    )
    run_retention_days: int = Field(
        default=30,
        ge=1,
        le=3650,
        description="days a finished run and its events stay in the Dagster instance (partitioned runs stay for good): "
        "every sync cycle's events would otherwise fill its database (cleanup/run_retention.py)",
    )
    sync_run_minutes: float = Field(
        default=DEFAULT_SYNC_RUN_MINUTES,
        ge=0,
        le=MAX_SYNC_RUN_MINUTES,
        description="how long one books_sync run keeps syncing before it ends (the schedule starts the next); 0: one cycle",
    )
    merge_interval_seconds: float = Field(
        default=DEFAULT_MERGE_INTERVAL_SECONDS,
        ge=MIN_MERGE_INTERVAL_SECONDS,
        le=MAX_MERGE_INTERVAL_SECONDS,
        description="seconds from one sync cycle's start to the next",
    )
    longest_merge_interval_seconds: float = Field(
        default=DEFAULT_LONGEST_MERGE_INTERVAL_SECONDS,
        ge=MIN_MERGE_INTERVAL_SECONDS,
        le=MAX_MERGE_INTERVAL_SECONDS,
        description="after each cycle that found nothing to merge the interval doubles, up to this (never below "
        "merge_interval_seconds): a quiet table costs fewer requests, and its first change waits at most this long",
    )
    table_checks_every_cycles: int = Field(
        default=6,
        ge=1,
        description="the checks that list S3 (backlog, quarantine) run on every n-th "
        "recorded cycle (the backlog also whenever the capture is behind the stream, the quarantine whenever a cycle "
        "quarantined something)",
    )
    parity_settle_seconds: float = Field(
        default=120.0,
        ge=0,
        description="a key that differs between library.books and DynamoDB this long is divergence, not a change in flight "
        "(at least twice the longest merge interval: a change waits for its cycle, then the cycle and its upkeep; the "
        "requirement's two minutes)",
    )
    parity_scan_read_units_per_second: float = Field(
        default=1000.0,
        gt=0,
        le=MAX_PARITY_SCAN_READ_UNITS_PER_SECOND,
        description="the daily key parity check scans the DynamoDB table at most this fast (read units a second, as "
        "DynamoDB reports them; eventually consistent: 0.5 a 4 KB of items). On demand a scan costs the same units at any "
        "pace: 1,000 a second reads 10 GB in about 20 minutes, a twelfth of what a new on-demand table serves",
    )
    parity_scan_capacity_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="on a provisioned table, the scan uses at most this share of its read capacity (the application keeps the rest)",
    )
    parity_scan_segments: int = Field(default=4, ge=1, le=1000, description="scan segments the key parity check reads in turn")
    parity_scan_max_hours: float = Field(
        default=20.0,
        gt=0,
        le=23,
        description="the key parity check fails without scanning when its scan, at its pace, would take longer (estimated "
        "from the table's size in DescribeTable): it would overlap the next day's check",
    )
    parity_max_tracked_keys: int = Field(
        default=100_000,
        ge=1,
        le=500_000,
        description="the key parity check names and follows at most this many differing keys (the driver holds each); "
        "it counts the others, and fails when there are any",
    )
    snapshot_retention_hours: float = Field(default=1.0, ge=1.0, description="expire snapshots older than this; at least 1 hour, longer than the longest query")
    snapshot_retain_last: int = Field(default=10, ge=1, description="snapshots kept whatever their age")
    orphan_file_age_days: float = Field(default=3.0, ge=1.0, description="remove files no snapshot references once older than this; at least 1 day")
    maintenance_interval_minutes: float = Field(
        default=15.0,
        gt=0,
        description="the upkeep run (streamed_upkeep, beside the sync) expires every streamed table's snapshots this often, and "
        "removes orphan files when orphan_sweep_interval_hours has gone by",
    )
    orphan_sweep_interval_hours: float = Field(
        default=24.0,
        gt=0,
        description="the upkeep run lists a table's files for orphans, and the sync run prunes its tombstones past their "
        "retention, this often: both read every retained manifest and find only what is days old",
    )
    compaction_file_threshold: int = Field(
        default=16,
        ge=2,
        le=1000,
        description="the sync run compacts library.books (and its tombstones) once a reader opens this "
        "many delete files, or this many data files more than the table's size needs: each sync commit adds one of each, "
        "every reader (Athena, and each cycle's own scan) pays for them, and a compaction holds one cycle back",
    )
    tombstone_retention_days: float = Field(
        default=7.0,
        ge=1.0,
        description="deletes are remembered this long, so that an older change of a deleted key never resurrects it; at "
        "least a day, the stream's retention: no change older than that can be replayed from the stream",
    )
    export_timeout_minutes: float = Field(default=180.0, gt=0, description="how long to wait for a DynamoDB export")
    export_poll_seconds: float = Field(default=30.0, gt=0, description="how often to ask DynamoDB about a running export")
    export_retention_days: float = Field(default=0.0, ge=0, description="keep loaded export files this many days (for audit) before the cleanup removes them")

    def setup_for_execution(self, context) -> None:
        """Refuses a run whose config points it at another deployment than the code location's: its bucket (where the
        writer leases are), namespace or DynamoDB tables name the tables its leases fence, so a run reading another
        table's stream into library.books, or holding its lease in another bucket, would be a second writer."""
        deployment = sync_settings(Settings.from_env())
        tables = declared_tables().values()
        moved = [
            f"{name} {mine!r} (the deployment's: {theirs!r})"
            for name, mine, theirs in [
                ("bucket", self.bucket, deployment.bucket),
                ("namespace", self.namespace, deployment.namespace),
                *((f"the DynamoDB table of {t.name}", self.dynamodb_table_of(t), deployment.dynamodb_table_of(t)) for t in tables),
            ]
            if mine != theirs
        ]
        if moved:
            raise SettingsError(
                "This run's config names another deployment than the code location's: "
                + "; ".join(moved)
                + ". A run cannot move a table: set the DDB_ATHENA_ variables of the code location (docs/operations.md)."
            )

    def dynamodb_table_of(self, table: TableDeclaration) -> str:
        """The DynamoDB table of a declared table in this deployment."""
        return self.dynamodb_tables.get(table.name) or table.dynamodb_table

    def capture_of(self, table: TableDeclaration) -> str:
        """Who reads `table`'s stream: its declaration's capture, else the deployment's (books_capture)."""
        return table.capture or self.books_capture

    def iceberg_table_of(self, table: TableDeclaration) -> str:
        return qualified_name(self.namespace, table.iceberg_table)

    def layout_of(self, table: TableDeclaration) -> SourceLayout:
        return SourceLayout(self.bucket, table.source_prefix)

    def parity_settle_seconds_of(self, table: TableDeclaration) -> float:
        """How long a key of `table` may differ while its change is in flight: at least two of its own intervals."""
        return max(self.parity_settle_seconds, PARITY_SETTLE_INTERVALS * (table.merge_interval_seconds or 0.0))

    @property
    def snapshot_retention(self) -> timedelta:
        return timedelta(hours=self.snapshot_retention_hours)

    def snapshot_retention_of(self, table: TableDeclaration) -> timedelta:
        """How long a table keeps its snapshots: its declaration's snapshot_retention_hours, else this resource's."""
        return timedelta(hours=table.snapshot_retention_hours) if table.snapshot_retention_hours else self.snapshot_retention

    @property
    def orphan_file_age(self) -> timedelta:
        return timedelta(days=self.orphan_file_age_days)

    def backlog_limit_of(self, table: TableDeclaration) -> timedelta:
        """How old an unmerged change of `table` may be: this resource's limit, or two of the table's own intervals."""
        return max(timedelta(minutes=self.backlog_limit_minutes), timedelta(seconds=2 * (table.merge_interval_seconds or 0.0)))


# The fields a deployment names once for every part (Settings reads them, with the local defaults).
DEPLOYMENT_FIELDS = ("bucket", "dynamodb_tables", "namespace")


# How many of the longest merge intervals a key may differ while its change is in flight: the wait for its cycle, then
# the cycle itself with its upkeep.
PARITY_SETTLE_INTERVALS = 2


def setting_variable(field_name: str) -> str:
    return SETTING_PREFIX + field_name.upper()


def sync_settings(settings: Settings, **options) -> SyncSettings:
    """The sync resource: each field from its variable (DDB_ATHENA_<FIELD>) where set, else its declared default;
    `options` over both (tests). Validated here, once, by the field's declaration: a bad value is refused when the
    code location loads, naming the variable."""
    deployment = {name: getattr(settings, name) for name in DEPLOYMENT_FIELDS}
    sync = from_variables(SyncSettings, settings.environ, **{**deployment, **options})
    if "longest_merge_interval_seconds" not in sync.model_fields_set:
        # Unset, the longest interval is never shorter than a longer merge interval.
        sync = sync.model_copy(update={"longest_merge_interval_seconds": max(sync.longest_merge_interval_seconds, sync.merge_interval_seconds)})
    values = {name for name in sync.model_fields_set if name not in options}
    # Between two variables only: a run's own merge interval (its config) may be shorter than the longest.
    if "longest_merge_interval_seconds" in values and sync.longest_merge_interval_seconds < sync.merge_interval_seconds:
        raise SettingsError(
            f"{setting_variable('longest_merge_interval_seconds')}={sync.longest_merge_interval_seconds:g}: shorter than the merge interval "
            f"({sync.merge_interval_seconds:g} s)"
        )
    # A change waits up to the longest interval for its cycle, then that cycle's merge and upkeep: the check would
    # call it divergence while it is in flight.
    if "parity_settle_seconds" in values and sync.parity_settle_seconds < PARITY_SETTLE_INTERVALS * sync.longest_merge_interval_seconds:
        raise SettingsError(
            f"{setting_variable('parity_settle_seconds')}={sync.parity_settle_seconds:g}: shorter than {PARITY_SETTLE_INTERVALS} longest merge "
            f"intervals ({PARITY_SETTLE_INTERVALS * sync.longest_merge_interval_seconds:g} s): a change in flight would count as divergence"
        )
    return sync


def settings_table() -> str:
    """Every setting as Markdown tables, from their declarations (docs/operations.md holds them, `ddb-athena settings`
    prints them; a test keeps the two equal): the deployment's, each exported table's, the sync resource's."""
    return "\n".join(
        [
            fields_table(DeploymentVariables, "variable"),
            fields_table(ExportedTableSettings, "variable (over the table's declared field)", prefix=f"{SETTING_PREFIX}<NAME>_"),
            fields_table(SyncSettings, "variable (`sync` resource field)", skip=DEPLOYMENT_FIELDS),
        ]
    )
