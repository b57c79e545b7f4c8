"""The Spark configuration for Iceberg, as a plain dict: local (Hadoop catalog, S3A on the emulator) or aws (Glue)."""

import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ddb_athena.lake.identifiers import validate_identifier
from ddb_athena.lake.local_jars import ICEBERG_VERSION

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
# The JIT compiles a method after 10x the usual calls: a sync cycle runs a long tail of planning code once
# every few seconds, and compiling it all took ~40% of a warm sync run's CPU (`bench-sync-cpu`: 11.5 -> 3.3
# CPU-s a minute for the compiler threads, 28.9 -> 24.2 in all); hot loops still compile.
LOCAL_JVM_OPTIONS = "-XX:+UseParallelGC -XX:CompileThresholdScaling=10"
# Spark's classes mapped from an archive of them (`ddb_athena_build.class_archive`) instead of read and verified at
# every start: a JVM's start and first queries ~6 CPU-s cheaper. An archive that does not match the class path is
# left unused with a warning the JVM prints on stdout, where `query --format json` prints its result: never logged.
CLASS_ARCHIVE_OPTIONS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# A manifest unread this long leaves the cache (longer than the longest idle interval between cycles); the cache holds
# at most this much of the JVM's heap.
MANIFEST_CACHE_EXPIRY_MS = 10 * 60 * 1000
MANIFEST_CACHE_BYTES = 32 * 1024 * 1024
GENERATED_CLASSES_KEPT = 2000
# Compiled from LocalWarehouseFileSystem.java by `ddb_athena_build.jars`.
LOCAL_FILE_SYSTEM_CLASS = "ddb_athena.hadoop.LocalWarehouseFileSystem"
PYTHON_DAEMON_MODULE = "ddb_athena.lake.python_daemon"
# Plain Spark in a Dagster run worker on AWS without the image's baked JARs (a laptop where Maven is reachable): Iceberg,
# its AWS bundle (Glue, S3FileIO) and Hadoop's S3A for the change and export files, at the versions pyspark 3.5 and
# Iceberg 1.10 pair with.
RUN_WORKER_AWS_PACKAGES = ",".join(
    (
        f"org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:{ICEBERG_VERSION}",
        f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_VERSION}",
        "org.apache.hadoop:hadoop-aws:3.3.4",
    )
)


@dataclass(frozen=True)
class SparkIcebergOptions:
    profile: str
    warehouse: str
    catalog: str = "lake"
    master: str | None = "local[2]"
    jars: Sequence[str] = ()
    jars_packages: str | None = None
    s3_endpoint_url: str | None = None
    region: str = "us-east-1"
    credentials: Mapping[str, str] = field(default_factory=dict)
    shuffle_partitions: int = 4
    local_file_system_jar: str | None = None
    class_archive: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def iceberg_spark_config(options: SparkIcebergOptions) -> dict[str, str]:
    catalog = validate_identifier(options.catalog, "catalog name")
    prefix = f"spark.sql.catalog.{catalog}"
    config = {
        "spark.app.name": "ddb_athena",
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.warehouse": options.warehouse,
        # `library.books` resolves in the Iceberg catalog, in SQL and in the `query` command.
        "spark.sql.defaultCatalog": catalog,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(options.shuffle_partitions),
        # Python UDF workers must run the interpreter that has this package installed (in-process sessions pass it
        # on as PYSPARK_PYTHON: `python_workers_from`).
        "spark.pyspark.python": sys.executable,
        "spark.ui.showConsoleProgress": "false",
        # A sync run repeats the same few dozen queries every few seconds; Spark keeps only 100 generated classes,
        # fewer than one cycle's queries need, so it compiled ~8 of them again every cycle, and the JVM then
        # JIT-compiled the new classes (`bench-sync-cpu`).
        "spark.sql.codegen.cache.maxEntries": str(GENERATED_CLASSES_KEPT),
        # Manifests never change once written, and each cycle plans its MERGE and its tombstone lookup over the same
        # ones as the cycle before, plus a few new: Iceberg's manifest cache keeps them in the JVM instead of reading
        # every one from S3 again each cycle (GET requests, docs/cost.md).
        f"{prefix}.io.manifest.cache-enabled": "true",
        f"{prefix}.io.manifest.cache.expiration-interval-ms": str(MANIFEST_CACHE_EXPIRY_MS),
        f"{prefix}.io.manifest.cache.max-total-bytes": str(MANIFEST_CACHE_BYTES),
    }
    if options.master:
        config["spark.master"] = options.master
    in_run_worker = runs_in_this_process(options.master)
    if in_run_worker:
        # The tasks run in this JVM, on few cores: a throughput collector leaves the cores to them,
        # where G1's concurrent threads cost a 2-core orders load ~20% (`make bench`). On a cluster
        # the platform's own JVM options stay.
        config["spark.driver.extraJavaOptions"] = LOCAL_JVM_OPTIONS
        if options.class_archive:
            # Quoted: Spark splits these options as a shell would.
            config["spark.driver.extraJavaOptions"] += f' "-XX:SharedArchiveFile={options.class_archive}" {CLASS_ARCHIVE_OPTIONS}'
        # This package is installed in the interpreter that runs the workers (`spark.pyspark.python`); on a
        # cluster it arrives with the job, after the daemon starts, so the cluster keeps Spark's own daemon.
        config["spark.python.daemon.module"] = PYTHON_DAEMON_MODULE
        # Nothing listens beyond loopback: the driver's RPC and block manager bind 127.0.0.1 (tasks run in this JVM),
        # and the web UI, which Spark binds to every interface, is off (turn it on with extra config to debug).
        config.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1", "spark.ui.enabled": "false"})
    if options.jars_packages:
        config["spark.jars.packages"] = options.jars_packages
    elif options.jars:
        config["spark.jars"] = ",".join(str(jar) for jar in options.jars)
    elif options.profile == "aws" and in_run_worker:
        config["spark.jars.packages"] = RUN_WORKER_AWS_PACKAGES

    if options.profile == "local":
        config[f"{prefix}.type"] = "hadoop"
        config.update(_s3a_emulator_config(options))
    elif options.profile == "aws":
        config[f"{prefix}.catalog-impl"] = "org.apache.iceberg.aws.glue.GlueCatalog"
        config[f"{prefix}.io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
        config[f"{prefix}.client.region"] = options.region
        # A commit every few seconds would otherwise archive a Glue table version each time, up to Glue's quota.
        config[f"{prefix}.glue.skip-archive"] = "true"
        # The task role or instance profile, never keys in the configuration.
        config["spark.hadoop.fs.s3a.aws.credentials.provider"] = "com.amazonaws.auth.DefaultAWSCredentialsProviderChain"
        if in_run_worker:
            # s3:// change and export files through S3A; on EMR and Glue the platform's own file system owns s3://.
            config["spark.hadoop.fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
    else:
        raise ValueError(f"unknown profile {options.profile!r}")
    config.update(options.extra)
    if in_run_worker and options.local_file_system_jar:
        # Hadoop's own runs a chmod process for every file written (~20 a sync cycle, ~0.7 CPU-s a minute: see
        # LocalWarehouseFileSystem.java). On the driver's class path, where Hadoop looks its file systems up, beside
        # any class path of the caller's.
        config.setdefault("spark.hadoop.fs.file.impl", LOCAL_FILE_SYSTEM_CLASS)
        class_path = (options.local_file_system_jar, config.get("spark.driver.extraClassPath"))
        config["spark.driver.extraClassPath"] = os.pathsep.join(filter(None, class_path))
    return config


def _s3a_emulator_config(options: SparkIcebergOptions) -> dict[str, str]:
    if not options.s3_endpoint_url:
        return {}
    config = {
        "spark.hadoop.fs.s3a.endpoint": options.s3_endpoint_url,
        "spark.hadoop.fs.s3a.endpoint.region": options.region,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(options.s3_endpoint_url.startswith("https")).lower(),
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    }
    if options.credentials:
        config.update(
            {
                "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                "spark.hadoop.fs.s3a.access.key": options.credentials["AWS_ACCESS_KEY_ID"],
                "spark.hadoop.fs.s3a.secret.key": options.credentials["AWS_SECRET_ACCESS_KEY"],
            }
        )
    return config


def runs_in_this_process(master: str | None) -> bool:
    """A local master: the tasks run in this process's JVM and the Python workers on this host (a run worker).
    No master: spark-submit or a cluster (EMR Serverless) chooses, and its executors run elsewhere."""
    return bool(master and master.startswith("local"))


@contextmanager
def python_workers_from(config: Mapping[str, str]) -> Iterator[None]:
    """While a local SparkContext starts in this process: its Python workers run `spark.pyspark.python`.

    PySpark reads the workers' interpreter from PYSPARK_PYTHON as the context starts; the setting is read only by
    spark-submit. Without this the workers ran whatever `python3` the PATH had, without this package or pyspark.
    On a cluster the workers run on other hosts, where this process's interpreter path means nothing: the
    platform's PYSPARK_PYTHON stays."""
    python = config.get("spark.pyspark.python")
    before = os.environ.get("PYSPARK_PYTHON")
    if python and runs_in_this_process(config.get("spark.master")):
        os.environ["PYSPARK_PYTHON"] = python
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = before


@contextmanager
def sigint_handler_kept() -> Iterator[None]:
    """Puts back the SIGINT handler that was in place before the block. For the creation of a SparkContext: PySpark
    installs its own (cancel every job, raise KeyboardInterrupt), which would end a sync cycle mid-merge on Ctrl-C
    instead of letting the loop's hold, or Dagster, stop the run between cycles."""
    handler = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    finally:
        # None: a handler not set from Python, which cannot be put back from here.
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
