import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from ddb_athena.lake.identifiers import InvalidIdentifierError
from ddb_athena.lake.session_config import (
    ICEBERG_EXTENSIONS,
    LOCAL_JVM_OPTIONS,
    RUN_WORKER_AWS_PACKAGES,
    SparkIcebergOptions,
    iceberg_spark_config,
    python_workers_from,
)

LOCAL = SparkIcebergOptions(
    profile="local",
    warehouse="file:///tmp/wh",
    jars=["/j/iceberg.jar", "/j/jackson.jar"],
    s3_endpoint_url="http://127.0.0.1:5055",
    credentials={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
)


def test_local_profile_uses_a_hadoop_catalog_local_jars_and_the_emulator():
    config = iceberg_spark_config(LOCAL)
    assert config["spark.sql.extensions"] == ICEBERG_EXTENSIONS
    assert config["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert config["spark.sql.catalog.lake.type"] == "hadoop"
    assert config["spark.sql.catalog.lake.warehouse"] == "file:///tmp/wh"
    assert config["spark.sql.defaultCatalog"] == "lake"
    assert config["spark.jars"] == "/j/iceberg.jar,/j/jackson.jar" and "spark.jars.packages" not in config
    assert config["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:5055"
    assert config["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert config["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert config["spark.hadoop.fs.s3a.access.key"] == "k"
    assert config["spark.sql.session.timeZone"] == "UTC"
    assert config["spark.driver.extraJavaOptions"] == LOCAL_JVM_OPTIONS


def test_a_compiled_local_file_system_serves_the_run_workers_file_paths():
    from dataclasses import replace

    config = iceberg_spark_config(replace(LOCAL, local_file_system_jar="/j/local-fs.jar"))
    assert config["spark.driver.extraClassPath"] == "/j/local-fs.jar"
    assert config["spark.hadoop.fs.file.impl"] == "ddb_athena.hadoop.LocalWarehouseFileSystem"

    assert "spark.hadoop.fs.file.impl" not in iceberg_spark_config(LOCAL)
    # A class path of the caller's keeps the file system's JAR, which the setting above needs at the JVM's start.
    with_theirs = iceberg_spark_config(replace(LOCAL, local_file_system_jar="/j/local-fs.jar", extra={"spark.driver.extraClassPath": "/theirs.jar"}))
    assert with_theirs["spark.driver.extraClassPath"] == "/j/local-fs.jar:/theirs.jar"
    assert "spark.hadoop.fs.file.impl" not in iceberg_spark_config(replace(LOCAL, local_file_system_jar="/j/local-fs.jar", master=None))


def test_maven_packages_replace_local_jars_when_set():
    from dataclasses import replace

    config = iceberg_spark_config(replace(LOCAL, jars_packages="org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.0"))
    assert config["spark.jars.packages"] == "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.0"
    assert "spark.jars" not in config


def test_aws_profile_uses_glue_and_s3fileio_and_no_emulator():
    config = iceberg_spark_config(
        SparkIcebergOptions(profile="aws", warehouse="s3://prod/warehouse", master=None, region="eu-west-1", extra={"spark.executor.memory": "4g"})
    )
    assert config["spark.sql.catalog.lake.catalog-impl"] == "org.apache.iceberg.aws.glue.GlueCatalog"
    assert config["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert config["spark.sql.catalog.lake.warehouse"] == "s3://prod/warehouse"
    assert config["spark.sql.catalog.lake.client.region"] == "eu-west-1"
    assert "spark.sql.catalog.lake.type" not in config and "spark.master" not in config
    assert not any(key.startswith("spark.hadoop.fs.s3a.endpoint") for key in config)
    assert config["spark.executor.memory"] == "4g"
    assert "spark.driver.extraJavaOptions" not in config  # the cluster's JVM options are not replaced


LOCAL_ONLY = ("spark.hadoop.fs.s3a.endpoint", "spark.hadoop.fs.s3a.path.style", "spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key")


@pytest.mark.parametrize("master", [None, "local[2]"])
def test_the_aws_profile_is_complete_and_carries_nothing_local(master):
    config = iceberg_spark_config(SparkIcebergOptions(profile="aws", warehouse="s3://prod/warehouse", master=master))
    assert config["spark.sql.catalog.lake.glue.skip-archive"] == "true"
    assert config["spark.hadoop.fs.s3a.aws.credentials.provider"] == "com.amazonaws.auth.DefaultAWSCredentialsProviderChain"
    # No emulator endpoint (a local master's driver binds loopback: its tasks run in the same JVM).
    loopback_binds = {"spark.driver.bindAddress", "spark.driver.host"}
    assert not [key for key in config if key.startswith(LOCAL_ONLY)]
    assert "127.0.0.1" not in str([value for key, value in config.items() if key not in loopback_binds])
    assert "spark.jars" not in config and "spark.sql.catalog.lake.type" not in config  # no local JARs, no Hadoop catalog
    if master is None:  # on EMR or Glue: the platform's Iceberg and its s3:// file system stay
        assert "spark.jars.packages" not in config and "spark.hadoop.fs.s3.impl" not in config
    else:  # plain Spark in the run worker: the runtime from Maven, s3:// through S3A
        assert config["spark.jars.packages"] == RUN_WORKER_AWS_PACKAGES
        assert config["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"


def test_no_credential_reaches_the_aws_configuration(monkeypatch):
    from ddb_athena.lib.settings import Settings
    from ddb_athena.resources import resources_from_settings

    secret = "never-in-config/3e9a1c7b5d"
    environ = {
        "DDB_ATHENA_PROFILE": "aws",
        "DDB_ATHENA_BUCKET": "prod",
        "DDB_ATHENA_SPARK_MASTER": "local[2]",
        "AWS_ACCESS_KEY_ID": "AKIANEVERINCONFIG7",
        "AWS_SECRET_ACCESS_KEY": secret,
    }
    config = resources_from_settings(Settings.from_env(environ))["spark"].spark_config()
    assert not [value for value in config.values() if secret in value or "AKIANEVERINCONFIG7" in value]


def test_jvm_options_given_as_extra_settings_replace_the_local_default():
    from dataclasses import replace

    config = iceberg_spark_config(replace(LOCAL, extra={"spark.driver.extraJavaOptions": "-XX:+UseG1GC"}))
    assert config["spark.driver.extraJavaOptions"] == "-XX:+UseG1GC"


def test_a_local_session_runs_with_the_throughput_collector(spark):
    collectors = {bean.getName() for bean in spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()}
    assert collectors == {"PS Scavenge", "PS MarkSweep"}


def test_bad_catalog_names_and_profiles_are_refused():
    from dataclasses import replace

    with pytest.raises(InvalidIdentifierError):
        iceberg_spark_config(replace(LOCAL, catalog="lake; drop"))
    with pytest.raises(ValueError):
        iceberg_spark_config(replace(LOCAL, profile="gcp"))


def test_the_resource_builds_the_same_config_from_the_environment(monkeypatch):
    from ddb_athena.lib.settings import Settings
    from ddb_athena.resources import resources_from_settings

    settings = Settings.from_env({"DDB_ATHENA_PROFILE": "aws", "DDB_ATHENA_BUCKET": "prod", "DDB_ATHENA_SPARK_PACKAGES": "g:a:1"})
    config = resources_from_settings(settings)["spark"].spark_config()
    assert config["spark.sql.catalog.lake.warehouse"] == "s3://prod/warehouse"
    assert config["spark.jars.packages"] == "g:a:1"


def test_a_submitted_job_gets_the_keys_in_its_environment_never_on_its_command_line():
    from ddb_athena.lake.job_submission import spark_submit_command
    from ddb_athena.lib.resources import IcebergSparkResource

    resource = IcebergSparkResource(
        profile="local", warehouse="file:///tmp/w", s3_endpoint_url="http://127.0.0.1:1", access_key_id="AKIAJOBKEY", secret_access_key="job/secret"
    )
    command = spark_submit_command(resource.spark_config(with_credentials=False), Path("/job.py"))
    assert not [argument for argument in command if "AKIAJOBKEY" in argument or "job/secret" in argument]
    assert resource.credential_environment() == {"AWS_ACCESS_KEY_ID": "AKIAJOBKEY", "AWS_SECRET_ACCESS_KEY": "job/secret"}
    assert resource.spark_config()["spark.hadoop.fs.s3a.secret.key"] == "job/secret"  # the run's own session keeps them


def test_local_python_workers_run_this_interpreter_and_import_pyspark_from_no_archive(spark):
    # Spark's own daemon, under whatever python3 the PATH has, imports pyspark from pyspark.zip and has the JARs
    # on its path; each task then re-reads every archive's directory.
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    spark_home = os.path.dirname(pyspark.__file__)

    @F.udf(StringType())
    def worker_facts(_):
        import json
        import os
        import sys

        import pyspark

        archives = [entry for entry in [*sys.path, *sys.path_importer_cache] if entry.startswith(spark_home) and (".zip" in entry or ".jar" in entry)]
        return json.dumps(
            {"python": sys.executable, "daemon": sys.modules["__main__"].__spec__.name, "archives": archives, "pyspark": os.path.dirname(pyspark.__file__)}
        )

    facts = json.loads(spark.range(1).select(worker_facts("id")).collect()[0][0])
    assert facts["python"] == sys.executable and facts["daemon"] == "ddb_athena.lake.python_daemon"
    assert facts["archives"] == [] and facts["pyspark"] == os.path.dirname(pyspark.__file__)


SPARK_ARCHIVES = os.pathsep.join(str(path) for path in sorted((Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip")))
DAEMON_PATH = (
    "import json, sys; from ddb_athena.lake.python_daemon import import_from_installed_packages; "
    "import_from_installed_packages(); import pyspark; "
    "print(json.dumps([[entry for entry in sys.path if entry.endswith('.zip') and 'pyspark' in entry], pyspark.__file__]))"
)


@pytest.mark.subprocess
@pytest.mark.parametrize("site_packages", [True, False])
def test_the_daemon_keeps_the_archives_only_for_an_interpreter_without_pyspark(site_packages):
    # -S: no site-packages, so pyspark and py4j exist only in Spark's archives.
    command = [sys.executable, *([] if site_packages else ["-S"]), "-c", DAEMON_PATH]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([SPARK_ARCHIVES, str(Path(__file__).parents[2])])}
    archives, imported_from = json.loads(subprocess.run(command, env=environment, capture_output=True, text=True, check=True).stdout)
    if site_packages:
        assert archives == [] and imported_from == pyspark.__file__
    else:
        assert archives == SPARK_ARCHIVES.split(os.pathsep) and ".zip" in imported_from


def test_python_workers_from_sets_pyspark_python_while_the_context_starts(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "python3")
    local = {"spark.master": "local[2]", "spark.pyspark.python": "/venv/bin/python"}
    with python_workers_from(local):
        assert os.environ["PYSPARK_PYTHON"] == "/venv/bin/python"
    assert os.environ["PYSPARK_PYTHON"] == "python3"
    monkeypatch.delenv("PYSPARK_PYTHON")
    with python_workers_from(local):
        pass
    assert "PYSPARK_PYTHON" not in os.environ


def test_a_cluster_session_keeps_the_platforms_python_for_its_workers(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    cluster = iceberg_spark_config(SparkIcebergOptions(profile="aws", warehouse="s3://prod/warehouse", master=None))
    with python_workers_from(cluster):
        assert os.environ["PYSPARK_PYTHON"] == "/usr/bin/python3"


def test_a_cluster_keeps_sparks_own_python_daemon():
    config = iceberg_spark_config(SparkIcebergOptions(profile="aws", warehouse="s3://prod/warehouse", master=None))
    assert "spark.python.daemon.module" not in config
    assert iceberg_spark_config(LOCAL)["spark.python.daemon.module"] == "ddb_athena.lake.python_daemon"


def test_nothing_a_run_workers_spark_opens_listens_beyond_loopback(spark):
    import ipaddress

    import psutil

    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    listening = [c.laddr for c in psutil.Process(jvm_pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening  # the driver's RPC and block manager, py4j's gateway
    addresses = [ipaddress.ip_address(address.ip) for address in listening]
    assert all((getattr(address, "ipv4_mapped", None) or address).is_loopback for address in addresses), listening
    assert spark.conf.get("spark.ui.enabled") == "false"


def test_an_images_baked_jars_start_the_aws_profiles_spark_with_nothing_to_download(tmp_path, monkeypatch):
    from ddb_athena.lake import local_jars
    from ddb_athena.lib.resources import IcebergSparkResource

    monkeypatch.setattr(local_jars, "DEFAULT_JAR_DIR", tmp_path)
    resource = IcebergSparkResource(profile="aws", warehouse="s3://b/w", master="local[1]")
    assert resource.spark_config()["spark.jars.packages"] == RUN_WORKER_AWS_PACKAGES  # nothing baked: Maven's
    for name in local_jars.LOCAL_JAR_NAMES:  # an offline build's: the local set alone is not the aws profile's
        (tmp_path / name).write_bytes(b"PK")
    assert resource.spark_config()["spark.jars.packages"] == RUN_WORKER_AWS_PACKAGES
    for name in local_jars.IMAGE_JAR_NAMES:
        (tmp_path / name).write_bytes(b"PK")
    config = resource.spark_config()
    assert "spark.jars.packages" not in config
    assert config["spark.jars"].split(",") == [str(tmp_path / name) for name in local_jars.IMAGE_JAR_NAMES]
    assert "spark.jars" not in IcebergSparkResource(profile="aws", warehouse="s3://b/w", master=None).spark_config()  # a cluster's own
