"""The class-data-sharing archive of Spark's classes (`ddb_athena_build.class_archive`, dumped by `make install`): named
for the class path it was dumped with, mapped by the sessions it matches, and silent on stdout where it does not."""

import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from ddb_athena.lake.local_jars import local_file_system_jar_name, spark_class_archive, spark_class_archive_path
from ddb_athena.lake.session_config import CLASS_ARCHIVE_OPTIONS, LOCAL_JVM_OPTIONS, SparkIcebergOptions, iceberg_spark_config
from ddb_athena_build.class_archive import ensure_class_archive

LOCAL = SparkIcebergOptions(profile="local", warehouse="file:///tmp/wh")


def installed_archive() -> Path:
    archive = spark_class_archive()
    assert archive is not None, "make install dumps the archive (python -m ddb_athena_build.class_archive)"
    return archive


def test_the_archive_is_named_for_the_class_path_and_for_each_of_its_files_size_and_time(tmp_path: Path, monkeypatch):
    spark_home = tmp_path / "spark"
    (spark_home / "jars").mkdir(parents=True)
    spark_jar = spark_home / "jars" / "spark-core.jar"
    spark_jar.write_bytes(b"core")
    monkeypatch.setenv("SPARK_HOME", str(spark_home))

    without_file_system = spark_class_archive_path(tmp_path)
    assert without_file_system == spark_class_archive_path(tmp_path)
    assert without_file_system.parent == tmp_path and without_file_system.suffix == ".jsa"
    file_system_jar = tmp_path / local_file_system_jar_name()
    file_system_jar.write_bytes(b"fs")
    named = spark_class_archive_path(tmp_path)
    assert named != without_file_system
    file_system_jar.write_bytes(b"fs, rebuilt")
    renamed = spark_class_archive_path(tmp_path)
    assert renamed != named
    os.utime(spark_jar, ns=(0, 0))
    assert spark_class_archive_path(tmp_path) != renamed
    assert spark_class_archive(tmp_path) is None


def test_a_local_session_starts_from_its_archive_and_a_cluster_keeps_its_own_jvm_options():
    archive = "/a b/spark-classes-1.jsa"
    options = shlex.split(iceberg_spark_config(replace(LOCAL, class_archive=archive))["spark.driver.extraJavaOptions"])
    assert options == [*LOCAL_JVM_OPTIONS.split(), f"-XX:SharedArchiveFile={archive}", *CLASS_ARCHIVE_OPTIONS.split()]
    assert iceberg_spark_config(LOCAL)["spark.driver.extraJavaOptions"] == LOCAL_JVM_OPTIONS
    assert "spark.driver.extraJavaOptions" not in iceberg_spark_config(replace(LOCAL, master=None, class_archive=archive))


def test_the_sessions_jvm_maps_the_archive_make_install_dumped(spark):
    """An archive the JVM refuses (another class path, JDK or JAR) is not mapped: its warning is off, so only this
    shows that the suite's and a run's sessions really start from it."""
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    mapped = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if line.endswith(".jsa")}
    assert str(installed_archive()) in mapped


@pytest.mark.subprocess
def test_a_jvm_refusing_the_archive_says_nothing_on_stdout_where_the_cli_prints_json():
    java = shutil.which("java", path=f"{os.environ.get('JAVA_HOME', '')}/bin:{os.environ['PATH']}")
    refused = [java, f"-XX:SharedArchiveFile={installed_archive()}", "-cp", "/not-the-class-path", "-version"]
    loud = subprocess.run(refused, capture_output=True, text=True, check=True)
    assert "Unable to use shared archive" in loud.stdout  # the control: the warning exists, on stdout
    quiet = subprocess.run([*refused[:2], *CLASS_ARCHIVE_OPTIONS.split(), *refused[2:]], capture_output=True, text=True, check=True)
    assert quiet.stdout == "" and "version" in quiet.stderr


@pytest.mark.subprocess
def test_an_archive_that_cannot_be_dumped_leaves_nothing_behind_and_says_why(tmp_path: Path, monkeypatch, caplog):
    no_jdk = tmp_path / "no-jdk"
    (no_jdk / "bin").mkdir(parents=True)
    monkeypatch.setenv("JAVA_HOME", str(no_jdk))
    with caplog.at_level(logging.WARNING, logger="ddb_athena_build.class_archive"):
        assert ensure_class_archive(tmp_path) is None
    assert "No class-data-sharing archive" in caplog.text
    assert [path.name for path in tmp_path.iterdir()] == ["no-jdk"]
