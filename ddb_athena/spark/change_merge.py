"""Applies change files to an Iceberg table with one MERGE INTO (Spark only, no Dagster).

Guarantees:
- the latest change per key wins by stream sequence number; an older change never
  overwrites a newer one (the row keeps the sequence number it was written from);
- a deleted key is remembered in a tombstone table, so replaying an older insert or update
  for it (a retried run, a partly failed cleanup, a late file) never resurrects it;
- re-applying files that were already applied changes nothing;
- a bad record is quarantined with its reason, and everything else is applied.
"""

from dataclasses import dataclass, field
from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from ddb_athena.capture.change_files import EVENT_NAMES, is_change_file
from ddb_athena.dynamodb_json import item_problem
from ddb_athena.identifiers import dotted_name, qualified_name, validate_identifier
from ddb_athena.spark.plan_settings import session_settings
from ddb_athena.table_spec import (
    CHANGED_AT_COLUMN,
    ITEM_COLUMN,
    METADATA_UPKEEP_PROPERTIES,
    SEQUENCE_COLUMN,
    SEQUENCE_DIGITS,
    SYNCED_AT_COLUMN,
    TableSpec,
    create_table_sql,
    image_problem_sql,
    image_schema_ddl,
    properties_sql,
    set_properties_sql,
    typed_columns_sql,
    upsert_merge_sql,
)

BOOTSTRAP_FILE_PROPERTY = "ddb_athena.bootstrap-file"
# A stream batch is a few rows to a few thousand: one shuffle partition and a static plan (adaptive execution
# plans each stage again) cost ~10% less CPU per sync cycle (interleaved A/B in one warm session, README "CPU of a
# sync cycle"). A bootstrap's rebuild, the whole table, keeps the session's settings.
STREAM_BATCH_PLAN = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "1"}
_ENVELOPE_SCHEMA = "event_name string, keys string, new_image string, sequence_number string, approximate_creation_time string"


@dataclass
class MergeResult:
    change_files: list[str]
    records_read: int = 0
    records_quarantined: int = 0
    records_superseded: int = 0
    changes: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale_skipped: int = 0
    bootstrap_file: str | None = None
    snapshot_id: int | None = None
    newest_change_at: datetime | None = None
    quarantine_reasons: dict[str, int] = field(default_factory=dict)


def tombstone_table(target: str) -> str:
    return f"{target}_tombstones"


def row_versions(spark: SparkSession, target: str, key: str) -> dict[str, str | None]:
    """Every key of the table, with the sequence number of the change its row was written from."""
    rows = spark.table(dotted_name(target)).select(validate_identifier(key, "key column"), SEQUENCE_COLUMN).collect()
    return {row[0]: row[1] for row in rows}


def _newest_deletes(spark: SparkSession, target: str, key: str) -> DataFrame:
    """`key`, `_tombstone`: each deleted key's newest delete. Tombstones are appended (one row per delete applied),
    so that is its highest sequence number."""
    tombstones = spark.table(dotted_name(tombstone_table(target)))
    return tombstones.groupBy(F.col(validate_identifier(key, "key column")).alias("key")).agg(F.max(SEQUENCE_COLUMN).alias("_tombstone"))


def tombstone_versions(spark: SparkSession, target: str, key: str, keys: set[str]) -> dict[str, str]:
    """The sequence number of the newest delete of each of `keys` that was ever deleted from the table."""
    wanted = spark.createDataFrame([(value,) for value in sorted(keys)], "key string")
    return {row["key"]: row["_tombstone"] for row in _newest_deletes(spark, target, key).join(F.broadcast(wanted), "key").collect()}


def ensure_table(spark: SparkSession, spec: TableSpec, target: str) -> None:
    """Creates the namespace and the table of `spec` if they do not exist, and brings its properties up to the spec."""
    namespace = qualified_name(*target.split(".")[:-1])
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
    spark.sql(create_table_sql(spec, target))
    _bring_properties_up_to(spark, target, dict(spec.properties))


def _bring_properties_up_to(spark: SparkSession, target: str, properties: dict[str, str]) -> None:
    # A table created by an earlier version takes the current properties (write tuning, metadata upkeep).
    current = table_properties(spark, target)
    stale = {name: value for name, value in properties.items() if current.get(name) != value}
    if stale:
        spark.sql(set_properties_sql(target, stale))


def ensure_tables(spark: SparkSession, spec: TableSpec, target: str) -> None:
    """The table and its tombstones."""
    ensure_table(spark, spec, target)
    tombstone_properties = {"format-version": "2", "write.merge.mode": "merge-on-read", **dict(METADATA_UPKEEP_PROPERTIES)}
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {dotted_name(tombstone_table(target))} "
        f"({spec.key.name} string, {SEQUENCE_COLUMN} string, deleted_at timestamp) USING iceberg "
        f"TBLPROPERTIES ({properties_sql(tombstone_properties)})"
    )
    _bring_properties_up_to(spark, tombstone_table(target), dict(METADATA_UPKEEP_PROPERTIES))


def table_exists(spark: SparkSession, target: str) -> bool:
    return spark.catalog.tableExists(dotted_name(target))


def current_snapshot_id(spark: SparkSession, target: str) -> int | None:
    return snapshot_id_of(table_properties(spark, target))


def snapshot_id_of(properties: dict[str, str]) -> int | None:
    # Iceberg's Spark table lists its current snapshot among its properties: no scan of the snapshots table.
    value = properties.get("current-snapshot-id", "none")
    return None if value == "none" else int(value)


def table_properties(spark: SparkSession, target: str) -> dict[str, str]:
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES {dotted_name(target)}").collect()}


def _count_where(condition: str):
    return F.sum(F.when(F.expr(condition), 1).otherwise(0))


def _tombstones_of(changes: DataFrame, key: str) -> DataFrame:
    """Tombstone rows (the tombstone table's columns) for the REMOVE changes among `changes`."""
    return changes.where("event_name = 'REMOVE'").select(
        F.col("key").alias(key), SEQUENCE_COLUMN, F.col(CHANGED_AT_COLUMN).alias("deleted_at")
    )


def _validated_changes(spark: SparkSession, spec: TableSpec, uris: list[str]) -> DataFrame:
    """Every line of the files with its parsed fields and the reason it cannot be applied (NULL if it can)."""
    key = spec.key
    item_problem_udf = F.udf(item_problem, StringType())
    lines = (
        spark.read.text(uris)
        .select(F.input_file_name().alias("source_file"), F.col("value").alias("line"))
        .where(F.trim("line") != "")
        .withColumn("file_name", F.regexp_extract("source_file", r"([^/]+)$", 1))
        .withColumn("envelope", F.from_json("line", _ENVELOPE_SCHEMA))
        .select("source_file", "file_name", "line", "envelope.*")
        .withColumn("image", F.from_json("new_image", image_schema_ddl(spec)))
        .withColumn("key", F.get_json_object("keys", f"$.{key.attribute}.{key.type_tag}"))
    )
    events = ", ".join(f"'{name}'" for name in EVENT_NAMES)
    reason = F.expr(
        "CASE "
        "WHEN get_json_object(line, '$') IS NULL THEN 'not valid JSON' "
        f"WHEN event_name IS NULL OR event_name NOT IN ({events}) THEN concat('unknown event name: ', coalesce(event_name, 'none')) "
        f"WHEN sequence_number IS NULL OR NOT sequence_number RLIKE '^[0-9]{{1,{SEQUENCE_DIGITS}}}$' THEN 'missing or malformed sequence_number' "
        f"WHEN key IS NULL THEN 'missing key attribute {key.attribute} ({key.type_tag})' "
        "WHEN try_cast(approximate_creation_time AS timestamp) IS NULL THEN 'missing or malformed approximate_creation_time' "
        "WHEN new_image IS NULL AND event_name <> 'REMOVE' THEN 'missing new_image' "
        "ELSE NULL END"
    )
    checked = lines.withColumn("reason", reason)
    checked = checked.withColumn("reason", F.coalesce("reason", item_problem_udf("new_image")))
    return checked.withColumn(
        "reason", F.coalesce("reason", F.when(F.col("event_name") != "REMOVE", F.expr(image_problem_sql(spec))))
    )


def _utc(moment: datetime | None) -> datetime | None:
    # The session time zone is UTC, so Spark's naive timestamps are UTC.
    return moment.replace(tzinfo=timezone.utc) if moment else None


def _latest_per_key(changes: DataFrame) -> DataFrame:
    """One row per key: the change with the highest stream sequence number (ties: the later file)."""
    order = Window.partitionBy("key").orderBy(F.col(SEQUENCE_COLUMN).desc(), F.col("file_name").desc())
    return changes.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank")


def _typed(spec: TableSpec, changes: DataFrame, synced_at: datetime) -> DataFrame:
    # The merge time joins as data (a one-row relation), not as a literal: Spark inlines timestamp literals into
    # the Java it generates, so a new literal every cycle meant new classes to compile and JIT every cycle (about
    # a fifth of a warm sync run's CPU).
    merged_at = changes.sparkSession.createDataFrame([(synced_at,)], f"{SYNCED_AT_COLUMN} timestamp")
    # The key comes from the record's Keys: a REMOVE has no image to take it from.
    typed = changes.selectExpr(
        "key",
        "event_name",
        "file_name",
        f"key AS {spec.key.name}",
        *typed_columns_sql(spec.columns, "image"),
        f"new_image AS {ITEM_COLUMN}",
        f"lpad(sequence_number, {SEQUENCE_DIGITS}, '0') AS {SEQUENCE_COLUMN}",
        f"CAST(approximate_creation_time AS timestamp) AS {CHANGED_AT_COLUMN}",
    )
    return typed.crossJoin(F.broadcast(merged_at))


def merge_change_files(
    spark: SparkSession,
    spec: TableSpec,
    target: str,
    change_file_uris: list[str],
    quarantine_uri: str,
    ensure: bool = True,
) -> MergeResult:
    """Applies exactly the given change files to `target` (a `namespace.table` in the default catalog).

    `ensure=False` skips creating the tables and updating their properties: a caller that merges every few
    seconds does that once."""
    if ensure:
        ensure_tables(spark, spec, target)
    result = MergeResult(change_files=list(change_file_uris))
    if not change_file_uris:
        return _with_snapshot(spark, target, result)

    validated = _validated_changes(spark, spec, change_file_uris).persist()
    try:
        # One pass for every count this function needs: per file, outcome and kind of record.
        with session_settings(spark, STREAM_BATCH_PLAN):
            summary = validated.groupBy("file_name", "reason", (F.col("event_name") == "SNAPSHOT").alias("is_snapshot")).count().collect()
        result.records_read = sum(row["count"] for row in summary)
        for row in summary:
            if row["reason"] is not None:
                result.quarantine_reasons[row["reason"]] = result.quarantine_reasons.get(row["reason"], 0) + row["count"]
        result.records_quarantined = sum(result.quarantine_reasons.values())
        if result.records_quarantined:
            bad = validated.where("reason IS NOT NULL").select("source_file", "line", "reason")
            bad.coalesce(1).write.mode("append").json(quarantine_uri)

        # A snapshot file replaces everything captured before it (see capture/bootstrap.py).
        cutoff = table_properties(spark, target).get(BOOTSTRAP_FILE_PROPERTY) or ""
        valid = [row for row in summary if row["reason"] is None and row["file_name"] > cutoff]
        result.bootstrap_file = max((row["file_name"] for row in valid if row["is_snapshot"]), default=None)
        first_file = max(cutoff, result.bootstrap_file or "")
        applicable = sum(row["count"] for row in valid if row["file_name"] >= first_file)
        result.records_superseded = result.records_read - result.records_quarantined - applicable
        if not applicable:
            return _with_snapshot(spark, target, result)

        good = _typed(spec, validated.where("reason IS NULL"), datetime.now(timezone.utc))
        good = good.where(F.col("file_name") > cutoff).where(F.col("file_name") >= first_file)
        latest = _latest_per_key(good)
        if result.bootstrap_file:
            _rebuild(spark, spec, target, latest, result)
        else:
            with session_settings(spark, STREAM_BATCH_PLAN):
                _upsert(spark, spec, target, latest, result)
    finally:
        validated.unpersist()
    return _with_snapshot(spark, target, result)


def _with_snapshot(spark: SparkSession, target: str, result: MergeResult) -> MergeResult:
    result.snapshot_id = current_snapshot_id(spark, target)
    return result


def _upsert(spark: SparkSession, spec: TableSpec, target: str, latest: DataFrame, result: MergeResult) -> None:
    key = spec.key.name
    target_sql = dotted_name(target)
    tombstones_sql = dotted_name(tombstone_table(target))
    tombstones = _newest_deletes(spark, target, key)
    current = spark.table(target_sql).select(F.col(key).alias("key"), F.col(SEQUENCE_COLUMN).alias("_current"))
    # Classify each change against the table as it is now (runs never overlap, so it stays so).
    classified = (
        latest.join(tombstones, "key", "left")
        .join(current, "key", "left")
        .withColumn(
            "_action",
            F.expr(
                f"CASE WHEN _current IS NOT NULL AND {SEQUENCE_COLUMN} <= _current THEN 'stale' "
                "WHEN event_name = 'REMOVE' AND _current IS NOT NULL THEN 'delete' "
                # Not newer than the key's last delete: already applied, or older than it.
                f"WHEN _tombstone IS NOT NULL AND {SEQUENCE_COLUMN} <= _tombstone THEN 'stale' "
                "WHEN event_name = 'REMOVE' THEN 'tombstone' "
                "WHEN _current IS NOT NULL THEN 'update' ELSE 'insert' END"
            ),
        )
        .localCheckpoint()
    )
    summary = classified.groupBy("_action").agg(F.count("*").alias("count"), F.max(CHANGED_AT_COLUMN).alias("newest")).collect()
    counts = {row["_action"]: row["count"] for row in summary}
    result.newest_change_at = _utc(max((row["newest"] for row in summary if row["newest"]), default=None))
    result.changes = sum(counts.values())
    result.inserted, result.updated, result.deleted = counts.get("insert", 0), counts.get("update", 0), counts.get("delete", 0)
    result.stale_skipped = counts.get("stale", 0)

    applicable = classified.where("_action <> 'stale'")
    view = validate_identifier(f"{spec.table}_changes")
    # Tombstones first: if the run dies between the two commits, the retry still knows the delete (and appends
    # it again, which changes no key's newest delete). An append, not a MERGE: no join, a third of the jobs.
    if counts.get("delete", 0) + counts.get("tombstone", 0):
        _tombstones_of(applicable, key).writeTo(tombstones_sql).append()
    if result.inserted + result.updated + result.deleted:
        applicable.where("_action <> 'tombstone'").createOrReplaceTempView(view)
        spark.sql(upsert_merge_sql(spec, target, view))


def _rebuild(spark: SparkSession, spec: TableSpec, target: str, latest: DataFrame, result: MergeResult) -> None:
    """Replaces the table with the snapshot plus the changes after it, in one atomic overwrite."""
    key = spec.key.name
    target_sql = dotted_name(target)
    tombstones_sql = dotted_name(tombstone_table(target))
    if not is_change_file(result.bootstrap_file):
        raise ValueError(f"{result.bootstrap_file!r} is not a change file name")
    latest = latest.localCheckpoint()
    live = latest.where("event_name <> 'REMOVE'").select(*spec.table_column_names)
    before = spark.table(target_sql).select(F.col(key).alias("_old"))
    compared = before.join(live.select(F.col(key).alias("_new")), F.col("_old") == F.col("_new"), "full_outer")
    # Rows gained, kept and lost against the table being replaced, in one pass.
    inserted, updated, deleted = compared.agg(
        _count_where("_old IS NULL"), _count_where("_old IS NOT NULL AND _new IS NOT NULL"), _count_where("_new IS NULL")
    ).collect()[0]
    result.inserted, result.updated, result.deleted = inserted or 0, updated or 0, deleted or 0
    result.changes, newest = latest.agg(F.count("*"), F.max(CHANGED_AT_COLUMN)).collect()[0]
    result.newest_change_at = _utc(newest)
    removes = _tombstones_of(latest, key)
    removes.writeTo(tombstones_sql).overwrite(F.lit(True))
    live.writeTo(target_sql).overwrite(F.lit(True))
    spark.sql(set_properties_sql(target, {BOOTSTRAP_FILE_PROPERTY: result.bootstrap_file}))
