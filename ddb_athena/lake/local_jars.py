"""Where the local stack's Spark JARs are (`ddb_athena_build.jars` provisions them at install time): the local profile's
session finds them here, failing fast with the fix when they are missing."""

import hashlib
import os
import shutil
from pathlib import Path

# The source tree the package runs from (the local stack runs from a checkout: `pip install -e`).
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_JAR_DIR = Path(os.environ.get("DDB_ATHENA_JAR_DIR") or REPO_ROOT / ".ddb_athena" / "jars")

# The Iceberg release every JAR and Maven coordinate of the project names (the PyPI runtime's, the image's bundle).
ICEBERG_VERSION = "1.10.2"
ICEBERG_RUNTIME_JAR = f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"
RELOCATED_JACKSON_JAR = "iceberg-shaded-jackson-2.15.2.jar"
HADOOP_AWS_JAR = "hadoop-aws-3.3.1.jar"
AWS_SDK_BUNDLE_JAR = "aws-java-sdk-bundle-1.11.901.jar"
LOCAL_JAR_NAMES = (
    ICEBERG_RUNTIME_JAR,
    RELOCATED_JACKSON_JAR,
    HADOOP_AWS_JAR,
    AWS_SDK_BUNDLE_JAR,
)
# The aws profile's JARs in the deployment's image: the official Maven artifacts (deploy/artifacts.lock pins their
# SHA-256), the same as session_config.RUN_WORKER_AWS_PACKAGES resolves. They differ from the local set above, which
# PyPI alone provides: Iceberg's runtime there lacks its shaded Jackson (rebuilt from pyspark's), and S3A is hadoop-aws
# 3.3.1 with the AWS SDK 1.11.901 where pyspark's Hadoop 3.3.4 pairs with hadoop-aws 3.3.4 and the SDK 1.12.262.
IMAGE_JAR_NAMES = (
    ICEBERG_RUNTIME_JAR,
    f"iceberg-aws-bundle-{ICEBERG_VERSION}.jar",
    "hadoop-aws-3.3.4.jar",
    "aws-java-sdk-bundle-1.12.262.jar",
)

# Hadoop's local file system without a chmod process for every file it writes; optional: without a JDK to compile it,
# the local warehouse keeps Hadoop's own.
LOCAL_FILE_SYSTEM_SOURCE = REPO_ROOT / "ddb_athena_build" / "LocalWarehouseFileSystem.java"


class MissingJarsError(RuntimeError):
    """The local Spark JARs have not been provisioned yet."""


def local_jar_paths(jar_dir: Path | None = None) -> list[Path]:
    """Return the provisioned JARs, failing fast (no network) if any is missing."""
    jar_dir = jar_dir or DEFAULT_JAR_DIR
    paths = [jar_dir / name for name in LOCAL_JAR_NAMES]
    missing = [path.name for path in paths if not path.is_file()]
    if missing:
        raise MissingJarsError(
            f"Missing Spark JARs in {jar_dir}: {', '.join(missing)}. Run `make install` (or `python -m ddb_athena_build.jars`) to provision them."
        )
    return paths


def aws_profile_jar_paths(jar_dir: Path | None = None) -> list[Path] | None:
    """The JARs of the aws profile's Spark in a run worker where the image baked them into `jar_dir`, None where any
    is missing (Maven then provides them: `spark.jars.packages`)."""
    jar_dir = jar_dir or DEFAULT_JAR_DIR
    paths = [jar_dir / name for name in IMAGE_JAR_NAMES]
    return paths if all(path.is_file() for path in paths) else None


def local_file_system_jar_name() -> str:
    """Named for its source, so that a changed source is compiled again."""
    digest = hashlib.sha256(LOCAL_FILE_SYSTEM_SOURCE.read_bytes()).hexdigest()[:12]
    return f"ddb-athena-local-fs-{digest}.jar"


def local_file_system_jar(jar_dir: Path | None = None) -> Path | None:
    """The compiled local warehouse file system, or None where no JDK was at hand to compile it."""
    path = (jar_dir or DEFAULT_JAR_DIR) / local_file_system_jar_name()
    return path if path.is_file() else None


def spark_class_archive_path(jar_dir: Path | None = None) -> Path:
    """Where the class-data-sharing archive of a local Spark JVM lives (`ddb_athena_build.class_archive` dumps it): named
    for the JDK, the class path a local session puts before Spark's JARs (the compiled file system, if any) and Spark's
    JARs, each by path, size and time, so that a changed JDK, pyspark or JAR names another archive (the JVM would refuse
    the old one)."""
    from pyspark.find_spark_home import _find_spark_home  # the SPARK_HOME PySpark's launcher uses

    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home) / "bin" / "java" if java_home else Path(shutil.which("java") or "java")
    class_path = [path for path in [local_file_system_jar(jar_dir)] if path]
    spark_jars = sorted((Path(_find_spark_home()) / "jars").glob("*.jar"))
    digest = hashlib.sha256()
    for path in [java.resolve(), *class_path, *spark_jars]:
        stat = path.stat() if path.exists() else None
        digest.update(f"{path}|{stat and stat.st_size}|{stat and stat.st_mtime_ns}\n".encode())
    return (jar_dir or DEFAULT_JAR_DIR) / f"spark-classes-{digest.hexdigest()[:16]}.jsa"


def spark_class_archive(jar_dir: Path | None = None) -> Path | None:
    """The archive `make install` dumped for this JDK and these JARs, or None."""
    path = spark_class_archive_path(jar_dir)
    return path if path.is_file() else None
