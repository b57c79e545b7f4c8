"""Dump the class-data-sharing archive of the local profile's Spark JVM (`make install`).

A JVM started with the archive maps the classes it holds instead of reading and verifying them again: a Spark start
and its first queries cost ~6 CPU-s less (docs/performance-log.md). The archive holds the classes a short Iceberg
workload loads from the JVM's class path (Spark, Hadoop, the local file system; Iceberg's JARs come through Spark's
own class loader, which a JDK 17 archive does not cover), and is named for that class path
(`local_jars.spark_class_archive_path`): a session uses it only where it was dumped for its JDK and JARs.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from ddb_athena.lake.local_jars import spark_class_archive_path
from ddb_athena.lake.session_config import LOCAL_JVM_OPTIONS
from ddb_athena_build.jars import atomic_output

logger = logging.getLogger(__name__)

DUMP_TIMEOUT_SECONDS = 600
TABLE = "lake.archive.changes"
# What a sync cycle and an orders load ask of Spark, in miniature: a merge-on-read table written, merged, deleted
# from, read, its metadata listed and its files rewritten.
WORKLOAD = (
    f"CREATE TABLE {TABLE} (id string, n bigint, price decimal(38,2), at timestamp, day date) USING iceberg"
    " PARTITIONED BY (day) TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',"
    " 'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')",
    f"INSERT INTO {TABLE} VALUES ('a', 1, 1.50, current_timestamp(), current_date()), ('b', 2, 2.25, current_timestamp(), current_date())",
    f"MERGE INTO {TABLE} t USING changes c ON t.id = c.id WHEN MATCHED AND c.deleted THEN DELETE"
    " WHEN MATCHED THEN UPDATE SET t.n = c.n WHEN NOT MATCHED AND NOT c.deleted THEN INSERT (id, n, price, at, day)"
    " VALUES (c.id, c.n, c.price, current_timestamp(), current_date())",
    f"DELETE FROM {TABLE} WHERE n > 100",
    f"SELECT id, max(n), sum(price) FROM {TABLE} GROUP BY id ORDER BY id",
    f"SHOW TBLPROPERTIES {TABLE}",
    f"ALTER TABLE {TABLE} SET TBLPROPERTIES ('commit.retry.num-retries'='4')",
    f"SELECT * FROM {TABLE}.snapshots",
    f"SELECT file_path FROM {TABLE}.files",
    "CALL lake.system.rewrite_data_files(table => 'archive.changes')",
    "CALL lake.system.rewrite_position_delete_files(table => 'archive.changes')",
    "CALL lake.system.expire_snapshots(table => 'archive.changes', retain_last => 1)",
)


def ensure_class_archive(jar_dir: Path | None = None) -> Path | None:
    """The local profile's archive, dumped if missing; None where no JDK could dump it (sessions then start without)."""
    target = spark_class_archive_path(jar_dir)
    if target.is_file():
        return target
    try:
        with atomic_output(target) as partial:
            subprocess.run(
                [sys.executable, "-m", "ddb_athena_build.class_archive", "--dump-to", str(partial)],
                capture_output=True,
                text=True,
                timeout=DUMP_TIMEOUT_SECONDS,
                check=True,
            )
    except (subprocess.SubprocessError, FileNotFoundError) as error:  # FileNotFoundError: the JVM wrote no archive
        output = getattr(error, "stderr", None) or ""
        logger.warning("No class-data-sharing archive (Spark starts without it, a few CPU-seconds slower): %s\n%s", error, output[-2000:])
        return None
    for stale in target.parent.glob("spark-classes-*.jsa"):
        if stale != target:
            stale.unlink()
    return target


def run_workload(spark) -> None:
    """WORKLOAD in `spark`, its table left in place (`make bench-calibrate` times it too)."""
    spark.createDataFrame(
        [("a", 5, 3.0, False), ("b", 0, 0.0, True), ("c", 7, 4.0, False)], "id string, n bigint, price double, deleted boolean"
    ).createOrReplaceTempView("changes")
    for statement in WORKLOAD:
        spark.sql(statement).collect()


def dump(archive: Path) -> None:
    """Run the workload in a local session whose JVM writes the classes it loaded to `archive` as it exits."""
    from pyspark import SparkContext

    from ddb_athena.lib.resources import IcebergSparkResource

    with tempfile.TemporaryDirectory(prefix="ddb_athena_class_archive_") as warehouse:
        java_options = f'{LOCAL_JVM_OPTIONS} "-XX:ArchiveClassesAtExit={archive}"'
        resource = IcebergSparkResource(profile="local", warehouse=f"file://{warehouse}", extra_config={"spark.driver.extraJavaOptions": java_options})
        spark = resource.spark_session
        run_workload(spark)
        jvm = SparkContext._gateway.proc
        spark.stop()
        # The JVM exits when its standard input closes, and writes the archive on the way out.
        jvm.stdin.close()
        jvm.wait(timeout=DUMP_TIMEOUT_SECONDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Dump the class-data-sharing archive of the local profile's Spark.")
    parser.add_argument("--dump-to", type=Path, help="dump here (what ensure_class_archive runs in a process of its own)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.dump_to:
        dump(args.dump_to)
    elif archive := ensure_class_archive():
        print(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
