"""Loads DynamoDB export files into an Iceberg table with one insert-only MERGE INTO (Spark only, no Dagster).

- Both export layouts: full (`{"Item": ...}` per line) and incremental (`Keys`, `NewImage`,
  `OldImage`, `Metadata` per line); an incremental line without `NewImage` is a delete, which
  an insert-only table does not apply (it is counted).
- Documents are immutable: a key already in the table is never rewritten, so loading the same
  export again adds nothing. The match condition carries the partition column so that Iceberg
  reads only the partitions the batch touches.
- A document that changed anyway (its key is in the table with other content) is counted, with
  a sample of its keys.
- A corrupt gzip file, or a line that cannot be loaded, is quarantined with its reason;
  everything else loads.
"""

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from ddb_athena.lake.change_merge import add_columns, current_snapshot_id, ensure_table, record_filled, table_properties
from ddb_athena.lake.identifiers import dotted_name, validate_identifier
from ddb_athena.lake.plan_settings import session_settings
from ddb_athena.lake.table_keys import key_text, row_key
from ddb_athena.lake.table_spec import (
    CHANGED_AT_COLUMN,
    ITEM_COLUMN,
    SYNCED_AT_COLUMN,
    TableSpec,
    attributes_schema_ddl,
    image_problem_sql,
    image_schema_ddl,
    insert_only_merge_sql,
    set_properties_sql,
    timestamp_literal,
    type_mismatch_sql,
    typed_columns_sql,
    value_problem_cases,
)
from ddb_athena.lake.writer_branch import WriterBranch

MUTATED_KEYS_SAMPLE = 10
# The newest full export loaded into the table: it holds every item as of its time.
FULL_EXPORT_ARN_PROPERTY = "ddb_athena.full-export-arn"
FULL_EXPORT_TIME_PROPERTY = "ddb_athena.full-export-time"
_GZIP_CHUNK = 1 << 20


@dataclass(frozen=True)
class ExportDataFile:
    uri: str
    # Items (= lines) the export's manifest gives for the file; None: counted here by reading it.
    items: int | None = None


@dataclass
class ExportLoadResult:
    items_read: int = 0
    rows_inserted: int = 0
    duplicates_skipped: int = 0
    mutated_documents: int = 0
    mutated_keys_sample: list[str] = field(default_factory=list)
    deletes_ignored: int = 0
    records_quarantined: int = 0
    corrupt_files: list[str] = field(default_factory=list)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    # Documents loaded whose typed attribute has another DynamoDB type than its column (NULL there, whole in `item`).
    type_mismatches: dict[str, int] = field(default_factory=dict)
    columns_added: list[str] = field(default_factory=list)
    snapshot_id: int | None = None
    # The first and last day (UTC, ISO) of the loaded documents' partition column: the partitions this load touched.
    days_from: str | None = None
    days_to: str | None = None

    @property
    def accounted_for(self) -> int:
        """Every item read ends up in exactly one of these."""
        return self.rows_inserted + self.duplicates_skipped + self.deletes_ignored + self.records_quarantined


def gzip_problem(content: bytes) -> tuple[int, str | None]:
    """(complete lines before any damage, what is wrong) of a gzip file; (lines, None) when it is sound."""
    lines, position, member = 0, 0, zlib.decompressobj(wbits=31)
    try:
        while position < len(content):
            chunk = content[position : position + _GZIP_CHUNK]
            position += len(chunk)
            lines += member.decompress(chunk).count(b"\n")
            # Concatenated gzip members are one valid file.
            while member.eof and member.unused_data:
                rest, member = member.unused_data, zlib.decompressobj(wbits=31)
                lines += member.decompress(rest).count(b"\n")
        lines += member.flush().count(b"\n")
    except zlib.error as error:
        return lines, f"corrupt gzip: {error}"
    if not member.eof:
        return lines, "corrupt gzip: the stream ends early (truncated file)"
    return lines, None


def _check_files(spark: SparkSession, uris: list[str]) -> dict[str, tuple[int, str | None]]:
    """{path as Spark names it: (complete lines, problem)} of gzip files, read and decompressed in full."""
    check = F.udf(gzip_problem, "struct<lines: bigint, problem: string>")
    rows = spark.read.format("binaryFile").load(uris).select("path", check("content").alias("check")).collect()
    return {row["path"]: (row["check"]["lines"], row["check"]["problem"]) for row in rows}


def _lines(spark: SparkSession, uris: list[str]) -> DataFrame:
    # A damaged file yields its lines up to the damage instead of failing the load; every file's
    # line count is checked against what it should hold, so no loss goes unnoticed.
    return (
        spark.read.option("ignoreCorruptFiles", "true")
        .text(uris)
        .select(F.input_file_name().alias("source_file"), F.col("value").alias("line"))
        .where(F.trim("line") != "")
    )


def _records(spec: TableSpec, lines: DataFrame, exported_at: datetime, synced_at: datetime) -> DataFrame:
    """Every line as typed columns, its kind (full, put, delete) and the reason it cannot load (NULL if it can)."""
    parsed = (
        lines.select("source_file", "line", F.json_tuple("line", "Item", "NewImage", "Keys", "Metadata"))
        .toDF("source_file", "line", "full_item", "new_image", "keys", "metadata")
        .withColumn("image_json", F.coalesce("full_item", "new_image"))
        .withColumn("image", F.from_json("image_json", image_schema_ddl(spec)))
        .withColumn("key_values", F.from_json("keys", attributes_schema_ddl(spec.key_columns)))
        .withColumn(
            "kind",
            F.expr("CASE WHEN full_item IS NOT NULL THEN 'full' WHEN new_image IS NOT NULL THEN 'put' WHEN keys IS NOT NULL THEN 'delete' END"),
        )
    )
    key_problems = " ".join(value_problem_cases(spec.key_columns, "key_values", required=set(spec.key_columns), missing="missing key attribute"))
    reason = F.expr(
        "CASE WHEN kind IS NULL THEN "
        "CASE WHEN get_json_object(line, '$') IS NULL THEN 'not valid JSON' ELSE 'neither Item, NewImage nor Keys' END "
        f"WHEN kind = 'delete' THEN CASE {key_problems} END "
        f"ELSE {image_problem_sql(spec)} END"
    )
    return parsed.withColumn("reason", reason).selectExpr(
        "source_file",
        "kind",
        "reason",
        f"CASE WHEN kind <> 'delete' THEN {type_mismatch_sql(spec.columns, 'image_json')} END AS type_mismatch",
        # The raw line is kept only where it is needed: for the quarantine.
        "CASE WHEN reason IS NOT NULL THEN line END AS line",
        *typed_columns_sql(spec.all_columns, "image"),
        f"image_json AS {ITEM_COLUMN}",
        # Incremental lines carry the write time; a full export is the table as of its export time.
        f"coalesce(timestamp_micros(CAST(get_json_object(metadata, '$.WriteTimestampMicros.N') AS bigint)), "
        f"{timestamp_literal(exported_at)}) AS {CHANGED_AT_COLUMN}",
        f"{timestamp_literal(synced_at)} AS {SYNCED_AT_COLUMN}",
    )


def _document_fingerprint(item_column: str):
    # Attribute order is not part of a document: compare the attributes sorted by name.
    return F.xxhash64(F.to_json(F.array_sort(F.map_entries(F.from_json(item_column, "map<string,string>")))))


def _publish(spark: SparkSession, target: str, writer: WriterBranch | None, additions: list) -> None:
    if writer is not None:
        writer.publish(target)
    if additions:
        record_filled(spark, target, additions)


def _quarantine(spark: SparkSession, records: DataFrame, damaged: list[tuple[str, str]], quarantine_uri: str, result: ExportLoadResult) -> None:
    """Lines that cannot load, whole; loaded documents whose attribute has another type than its column, by reason only
    (the document is whole in the table)."""
    mismatched = records.where("reason IS NULL AND kind <> 'delete' AND type_mismatch IS NOT NULL")
    mismatched = mismatched.selectExpr("source_file", "CAST(NULL AS string) AS line", "type_mismatch AS reason", "true AS loaded")
    bad = records.where("reason IS NOT NULL").selectExpr("source_file", "line", "reason", "false AS loaded").unionByName(mismatched)
    if damaged:
        rows = [(path, None, reason, False) for path, reason in damaged]
        bad = bad.unionByName(spark.createDataFrame(rows, "source_file string, line string, reason string, loaded boolean"))
    bad = bad.persist()  # few rows: written, then counted by reason, from one read of the files
    try:
        bad.drop("loaded").coalesce(1).write.mode("append").json(quarantine_uri)
        for row in bad.groupBy("reason", "loaded").count().collect():
            counted = result.type_mismatches if row["loaded"] else result.quarantine_reasons
            counted[row["reason"]] = counted.get(row["reason"], 0) + row["count"]
    finally:
        bad.unpersist()


_LOAD_PLAN_SETTINGS = {
    # Adaptive execution can drop a finished stage from the final plan (an anti-join that turns out
    # empty), and the observed counts with it.
    "spark.sql.adaptive.enabled": "false",
    # A per-key limit before the shuffle sorts every row once more only to drop nothing: keys
    # repeat rarely within an export.
    "spark.sql.optimizer.windowGroupLimitThreshold": "-1",
}


def _one_copy_per_key(records: DataFrame, keys: list[str]) -> DataFrame:
    """One row per key; which copy is kept does not matter (copies differ only if mutated, and that is counted).

    A row number per key costs one shuffle and one sort, where dropDuplicates sorts the rows twice
    (a first() over strings aggregates by sorting, before and after the shuffle)."""
    copy_number = F.row_number().over(Window.partitionBy(*keys).orderBy(*keys))
    return records.withColumn("_copy", copy_number).where("_copy = 1").drop("_copy")


def _observed(observation: Observation) -> dict:
    metrics = observation.get
    if not metrics:
        raise RuntimeError("Spark reported no counts for the load's pass; the load committed, but its counts are unknown")
    return metrics


def _inserted_rows(spark: SparkSession, target: str, before: int | None, after: int | None) -> int:
    if after is None or after == before:
        return 0
    summary = spark.sql(f"SELECT summary FROM {dotted_name(target)}.snapshots WHERE snapshot_id = {int(after)}").collect()[0]["summary"]
    return int(summary.get("added-records", 0))


def table_loaded(spark: SparkSession, target: str) -> bool:
    """Whether `target` exists and has a snapshot (a first load has committed)."""
    return spark.catalog.tableExists(dotted_name(target)) and current_snapshot_id(spark, target) is not None


def loaded_full_export(spark: SparkSession, target: str) -> tuple[str, datetime] | None:
    """(ARN, time) of the newest full export loaded into `target`, if any."""
    if not spark.catalog.tableExists(dotted_name(target)):
        return None
    properties = table_properties(spark, target)
    if FULL_EXPORT_TIME_PROPERTY not in properties:
        return None
    return properties[FULL_EXPORT_ARN_PROPERTY], datetime.fromisoformat(properties[FULL_EXPORT_TIME_PROPERTY])


def record_loaded_full_export(spark: SparkSession, target: str, export_arn: str, export_time: datetime) -> None:
    """Records on the table that it holds every item as of `export_time` (after the load committed), unless a
    newer full export is recorded already."""
    loaded = loaded_full_export(spark, target)
    if loaded is None or loaded[1] < export_time:
        spark.sql(set_properties_sql(target, {FULL_EXPORT_ARN_PROPERTY: export_arn, FULL_EXPORT_TIME_PROPERTY: export_time.isoformat()}))


def _damaged_files(spark: SparkSession, files: list[ExportDataFile], items_read: int) -> list[tuple[str, str]]:
    """(file, what is wrong) of every file that yielded fewer lines than it holds."""
    unknown = [file.uri for file in files if file.items is None]
    checked = _check_files(spark, unknown) if unknown else {}
    damaged = [
        (path, f"{problem}; {lines} complete lines before the damage were read, the rest is lost") for path, (lines, problem) in checked.items() if problem
    ]
    expected = sum(file.items for file in files if file.items is not None) + sum(lines for lines, _ in checked.values())
    if items_read < expected:
        # Some file with a manifest count came up short: count per file to name it (only then).
        counted = [file for file in files if file.items is not None]
        per_file = dict(_lines(spark, [file.uri for file in counted]).groupBy("source_file").count().collect())
        by_name = {path.rsplit("/", 1)[-1]: count for path, count in per_file.items()}
        for file in counted:
            read = by_name.get(file.uri.rsplit("/", 1)[-1], 0)
            if read < file.items:
                damaged.append((file.uri, f"corrupt or unreadable file: read {read} of its {file.items} lines, the rest is lost"))
    return damaged


def load_export_files(
    spark: SparkSession,
    spec: TableSpec,
    target: str,
    files: list[ExportDataFile],
    quarantine_uri: str,
    exported_at: datetime,
    before_commit: Callable[[], None] = lambda: None,
    writer: WriterBranch | None = None,
) -> ExportLoadResult:
    """Loads exactly these export data files into `target` (a `namespace.table` in the default catalog).
    `before_commit` is called right before the MERGE: it raises when this writer may no longer commit. With a
    `writer`, the MERGE commits to that writer's branch and is published after it (writer_branch.py): a load that
    outlived its writer's lease (a job whose run died, a paused process) publishes nothing.

    The files are parsed once: the counts come from observations of the MERGE's own pass. Further
    passes happen only when they have something to find (bad lines, damaged files, copies within
    the batch, keys already loaded)."""
    partition_column = spec.partition_column
    if partition_column is None or partition_column.sql_type != "timestamp":
        raise ValueError(f"table {spec.table}: an export load needs a timestamp partition column for its match condition")
    additions = ensure_table(spark, spec, target)
    if writer is not None:
        writer.take(target)
    ref = writer.ref(target) if writer is not None else target
    result = ExportLoadResult(columns_added=[column.name for column in additions])
    if additions:
        # After the writer took the table: a writer of the older declaration is fenced, and publishes nothing more.
        before_commit()
        result.type_mismatches = add_columns(spark, spec, target, ref, additions, quarantine_uri)
    if not files:
        _publish(spark, target, writer, additions)
        result.snapshot_id = current_snapshot_id(spark, target)
        return result

    keys, partition = spec.key_names, partition_column.name
    records = _records(spec, _lines(spark, [file.uri for file in files]), exported_at, datetime.now(UTC))
    document = "reason IS NULL AND kind <> 'delete'"
    read = Observation("export_read")
    batch = Observation("export_batch")
    observed = records.observe(
        read,
        F.count("*").alias("items"),
        F.count_if(F.col("reason").isNotNull()).alias("quarantined"),
        F.count_if(F.expr("reason IS NULL AND kind = 'delete'")).alias("deletes"),
        F.count_if(F.expr(document)).alias("documents"),
        F.count_if(F.expr(f"{document} AND type_mismatch IS NOT NULL")).alias("mismatched"),
        # Epoch microseconds: observed timestamps do not come back as Python values.
        F.unix_micros(F.min(F.when(F.expr(document), F.col(partition)))).alias("low"),
        F.unix_micros(F.max(F.when(F.expr(document), F.col(partition)))).alias("high"),
    )
    deduplicated = _one_copy_per_key(observed.where(document), keys).observe(batch, F.count("*").alias("distinct"))
    view = validate_identifier(f"{spec.table}_export_batch")
    deduplicated.select(*spec.table_column_names).createOrReplaceTempView(view)
    before = current_snapshot_id(spark, target)
    before_commit()
    with session_settings(spark, _LOAD_PLAN_SETTINGS):
        spark.sql(insert_only_merge_sql(spec, ref, view))
    _publish(spark, target, writer, additions)
    result.snapshot_id = current_snapshot_id(spark, target)
    result.rows_inserted = _inserted_rows(spark, target, before, result.snapshot_id)

    counts, distinct = _observed(read), _observed(batch)["distinct"]
    if counts["low"] is not None:
        result.days_from, result.days_to = (datetime.fromtimestamp(counts[end] / 1e6, UTC).date().isoformat() for end in ("low", "high"))
    result.items_read, result.records_quarantined, result.deletes_ignored = counts["items"], counts["quarantined"], counts["deletes"]
    result.duplicates_skipped = counts["documents"] - result.rows_inserted
    damaged = _damaged_files(spark, files, result.items_read)
    result.corrupt_files = [path for path, _ in damaged]
    if result.records_quarantined or damaged or counts["mismatched"]:
        _quarantine(spark, records, damaged, quarantine_uri, result)
    valid = records.where(document)
    changed = []
    if distinct < counts["documents"]:
        changed.append(_changed_copies(valid, keys))
    if result.rows_inserted < distinct:
        low, high = (datetime.fromtimestamp(counts[end] / 1e6, UTC) for end in ("low", "high"))
        changed.append(_changed_since_loaded(spark, spec, target, valid, low, high))
    if changed:
        mutated = changed[0] if len(changed) == 1 else changed[0].unionByName(changed[1]).distinct()
        mutated = mutated.persist()
        try:
            result.mutated_documents = mutated.count()
            result.mutated_keys_sample = sorted(key_text(row_key(spec, row)) for row in mutated.limit(MUTATED_KEYS_SAMPLE).collect())
        finally:
            mutated.unpersist()
    return result


def _changed_copies(valid: DataFrame, keys: list[str]) -> DataFrame:
    """Keys that appear more than once in the batch with different content."""
    versions = valid.groupBy(*keys).agg(F.countDistinct(_document_fingerprint(ITEM_COLUMN)).alias("versions"))
    return versions.where("versions > 1").select(*keys)


def _changed_since_loaded(spark: SparkSession, spec: TableSpec, target: str, batch: DataFrame, low: datetime, high: datetime) -> DataFrame:
    """Keys of the batch already in the table with other content (read only in the batch's partitions)."""
    keys, partition = spec.key_names, spec.partition_column.name
    existing = (
        spark.table(dotted_name(target))
        .where(F.col(partition).between(F.lit(low.date()).cast("timestamp"), F.lit((high + timedelta(days=1)).date()).cast("timestamp")))
        .select(*keys, F.col(ITEM_COLUMN).alias("_stored_item"))
    )
    # Identical text is the same document; only differing text is compared attribute by attribute.
    differs = (F.col(ITEM_COLUMN) != F.col("_stored_item")) & (_document_fingerprint(ITEM_COLUMN) != _document_fingerprint("_stored_item"))
    return batch.join(existing, keys).where(differs).select(*keys).distinct()
