"""Dagster resources: AWS clients, the Iceberg-configured SparkSession, and the sync settings."""

from datetime import timedelta
from typing import Literal

import boto3
from botocore.config import Config
from dagster import ConfigurableResource
from dagster_aws.utils import ResourceWithBoto3Configuration
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from ddb_athena.capture.change_files import SourceLayout
from ddb_athena.identifiers import qualified_name
from ddb_athena.settings import BOOKS_SOURCE_PREFIX, ORDERS_EXPORT_PREFIX, Settings
from ddb_athena.spark.session_config import SparkIcebergOptions, iceberg_spark_config


class AwsClientsResource(ResourceWithBoto3Configuration):
    """boto3 clients for DynamoDB, DynamoDB Streams and S3, from one configuration, one per service."""

    _clients: dict = PrivateAttr(default_factory=dict)

    def client(self, service: str):
        # boto3 clients are thread-safe and costly to build; assets and checks of a run share them.
        if service not in self._clients:
            self._clients[service] = self._new_client(service)
        return self._clients[service]

    def _new_client(self, service: str):
        session = boto3.session.Session(
            profile_name=self.profile_name,
            aws_access_key_id=self.aws_access_key_id,
            aws_secret_access_key=self.aws_secret_access_key,
            aws_session_token=self.aws_session_token,
            region_name=self.region_name,
        )
        return session.client(
            service,
            endpoint_url=self.endpoint_url,
            use_ssl=self.use_ssl,
            verify=self.verify,
            config=Config(retries={"max_attempts": self.max_attempts, "mode": "standard"}),
        )


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

    def spark_config(self) -> dict[str, str]:
        jars: list = []
        if self.profile == "local" and not self.jars_packages:
            from ddb_athena.spark.jars import local_jar_paths

            jars = local_jar_paths()
        credentials = (
            {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
            if self.access_key_id and self.secret_access_key
            else {}
        )
        return iceberg_spark_config(
            SparkIcebergOptions(
                profile=self.profile,
                warehouse=self.warehouse,
                catalog=self.catalog,
                master=self.master,
                jars=[str(jar) for jar in jars],
                jars_packages=self.jars_packages,
                s3_endpoint_url=self.s3_endpoint_url,
                region=self.region,
                credentials=credentials,
                extra=self.extra_config,
            )
        )

    @property
    def spark_session(self) -> SparkSession:
        if self._pyspark is None:
            self._pyspark = LazyPySparkResource(spark_config=self.spark_config())
        return self._pyspark.spark_session

    @property
    def source_scheme(self) -> str:
        """s3a:// through Hadoop locally; s3:// on EMR and Glue, whose file systems own that scheme."""
        return "s3a" if self.profile == "local" else "s3"


class SyncSettings(ConfigurableResource):
    """Where the sources live and what the Iceberg tables are called."""

    bucket: str
    books_table: str = Field(description="DynamoDB table name of books")
    orders_table: str = Field(default="orders", description="DynamoDB table name of orders")
    namespace: str = "library"
    books_capture: Literal["run", "lambda"] = Field(
        default="run", description="who reads the books stream: the sync run itself, or the capture Lambda (deploy/ddb_athena.yaml)"
    )
    backlog_limit_minutes: float = Field(default=2.0, description="oldest unmerged change file allowed, in minutes")
    sync_run_minutes: float = Field(
        default=60.0, ge=0, description="how long one books_sync run keeps syncing before it ends (the schedule starts the next); 0: one cycle"
    )
    merge_interval_seconds: float = Field(default=10.0, gt=0, description="seconds from one sync cycle's start to the next")
    table_checks_every_cycles: int = Field(
        default=6, ge=1, description="the checks that read the table and DynamoDB run on every n-th recorded cycle"
    )
    snapshot_retention_hours: float = Field(
        default=1.0, ge=1.0, description="expire snapshots older than this; at least 1 hour, longer than the longest query"
    )
    snapshot_retain_last: int = Field(default=10, ge=1, description="snapshots kept whatever their age")
    orphan_file_age_days: float = Field(
        default=3.0, ge=1.0, description="remove files no snapshot references once older than this; at least 1 day"
    )
    maintenance_interval_minutes: float = Field(
        default=15.0, gt=0, description="the sync run compacts library.books, expires snapshots and removes orphans this often"
    )
    tombstone_retention_days: float = 7.0
    export_timeout_minutes: float = Field(default=180.0, description="how long to wait for a DynamoDB export")
    export_poll_seconds: float = Field(default=30.0, description="how often to ask DynamoDB about a running export")
    export_retention_days: float = Field(
        default=0.0, description="keep loaded export files this many days (for audit) before the cleanup removes them"
    )

    @property
    def books_layout(self) -> SourceLayout:
        return SourceLayout(self.bucket, BOOKS_SOURCE_PREFIX)

    @property
    def books_iceberg_table(self) -> str:
        return qualified_name(self.namespace, "books")

    @property
    def orders_layout(self) -> SourceLayout:
        return SourceLayout(self.bucket, ORDERS_EXPORT_PREFIX)

    @property
    def orders_iceberg_table(self) -> str:
        return qualified_name(self.namespace, "orders")

    @property
    def snapshot_retention(self) -> timedelta:
        return timedelta(hours=self.snapshot_retention_hours)

    @property
    def orphan_file_age(self) -> timedelta:
        return timedelta(days=self.orphan_file_age_days)

    @property
    def backlog_limit(self) -> timedelta:
        return timedelta(minutes=self.backlog_limit_minutes)


def resources_from_settings(settings: Settings, **sync_options) -> dict:
    credentials = settings.credentials or {}
    return {
        "aws": AwsClientsResource(
            region_name=settings.region,
            endpoint_url=settings.default_endpoint_url,
            aws_access_key_id=credentials.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=credentials.get("AWS_SECRET_ACCESS_KEY"),
        ),
        "spark": IcebergSparkResource(
            profile=settings.profile,
            warehouse=settings.warehouse,
            master=settings.spark_master,
            jars_packages=settings.spark_packages,
            s3_endpoint_url=settings.s3_endpoint_url,
            region=settings.region,
            access_key_id=credentials.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=credentials.get("AWS_SECRET_ACCESS_KEY"),
        ),
        "sync": SyncSettings(
            bucket=settings.bucket,
            books_table=settings.books_table,
            orders_table=settings.orders_table,
            namespace=settings.namespace,
            **{"books_capture": settings.books_capture, **sync_options},
        ),
    }
