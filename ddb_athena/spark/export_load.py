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
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ddb_athena.identifiers import dotted_name, validate_identifier
from ddb_athena.spark.change_merge import current_snapshot_id, ensure_table
from ddb_athena.table_spec import (
    CHANGED_AT_COLUMN,
    ITEM_COLUMN,
    SYNCED_AT_COLUMN,
    TableSpec,
    image_problem_sql,
    image_schema_ddl,
    insert_only_merge_sql,
    typed_columns_sql,
)

MUTATED_KEYS_SAMPLE = 10
_GZIP_CHUNK = 1 << 20


@dataclass
class ExportLoadResult:
    files: int
    bytes_read: int = 0
    items_read: int = 0
    rows_inserted: int = 0
    duplicates_skipped: int = 0
    mutated_documents: int = 0
    mutated_keys_sample: list[str] = field(default_factory=list)
    deletes_ignored: int = 0
    records_quarantined: int = 0
    corrupt_files: list[str] = field(default_factory=list)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    snapshot_id: int | None = None

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


def _check_files(spark: SparkSession, uris: list[str]) -> list:
    """(path as Spark names it, size, complete lines, problem) of every file."""
    check = F.udf(gzip_problem, "struct<lines: bigint, problem: string>")
    return (
        spark.read.format("binaryFile")
        .load(uris)
        .select("path", "length", check("content").alias("check"))
        .select("path", "length", "check.lines", "check.problem")
        .collect()
    )


def _lines(spark: SparkSession, sound: list[str], corrupt: list[str]) -> DataFrame:
    frames = []
    if sound:
        frames.append(spark.read.text(sound))
    if corrupt:
        # Only files already known to be corrupt are read leniently: their lines up to the damage.
        frames.append(spark.read.option("ignoreCorruptFiles", "true").text(corrupt))
    lines = frames[0]
    for frame in frames[1:]:
        lines = lines.unionByName(frame)
    return lines.select(F.input_file_name().alias("source_file"), F.col("value").alias("line")).where(F.trim("line") != "")


def _records(spec: TableSpec, lines: DataFrame, exported_at: datetime, synced_at: datetime) -> DataFrame:
    """Every line as typed columns, its kind (full, put, delete) and the reason it cannot load (NULL if it can)."""
    key = spec.key
    parsed = (
        lines.select("source_file", "line", F.json_tuple("line", "Item", "NewImage", "Keys", "Metadata"))
        .toDF("source_file", "line", "full_item", "new_image", "keys", "metadata")
        .withColumn("image_json", F.coalesce("full_item", "new_image"))
        .withColumn("image", F.from_json("image_json", image_schema_ddl(spec)))
        .withColumn(
            "kind",
            F.expr(
                "CASE WHEN full_item IS NOT NULL THEN 'full' WHEN new_image IS NOT NULL THEN 'put' "
                "WHEN keys IS NOT NULL THEN 'delete' END"
            ),
        )
    )
    reason = F.expr(
        "CASE WHEN kind IS NULL THEN "
        "CASE WHEN get_json_object(line, '$') IS NULL THEN 'not valid JSON' ELSE 'neither Item, NewImage nor Keys' END "
        f"WHEN kind = 'delete' THEN CASE WHEN get_json_object(keys, '$.{key.attribute}.{key.type_tag}') IS NULL "
        f"THEN 'missing key attribute {key.attribute} ({key.type_tag})' END "
        f"ELSE {image_problem_sql(spec)} END"
    )
    exported = exported_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    synced = synced_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    return parsed.withColumn("reason", reason).selectExpr(
        "source_file",
        "kind",
        "reason",
        # The raw line is kept only where it is needed: for the quarantine.
        "CASE WHEN reason IS NOT NULL THEN line END AS line",
        *typed_columns_sql(spec.all_columns, "image"),
        f"image_json AS {ITEM_COLUMN}",
        # Incremental lines carry the write time; a full export is the table as of its export time.
        f"coalesce(timestamp_micros(CAST(get_json_object(metadata, '$.WriteTimestampMicros.N') AS bigint)), "
        f"CAST('{exported}' AS timestamp)) AS {CHANGED_AT_COLUMN}",
        f"CAST('{synced}' AS timestamp) AS {SYNCED_AT_COLUMN}",
    )


def _document_fingerprint(item_column: str):
    # Attribute order is not part of a document: compare the attributes sorted by name.
    return F.xxhash64(F.to_json(F.array_sort(F.map_entries(F.from_json(item_column, "map<string,string>")))))


def _quarantine(spark: SparkSession, records: DataFrame, corrupt: list, quarantine_uri: str) -> None:
    bad = records.where("reason IS NOT NULL").select("source_file", "line", "reason")
    if corrupt:
        damaged = spark.createDataFrame(
            [
                (row["path"], None, f"{row['problem']}; {row['lines']} complete lines before the damage were read, the rest is lost")
                for row in corrupt
            ],
            "source_file string, line string, reason string",
        )
        bad = bad.unionByName(damaged)
    bad.coalesce(1).write.mode("append").json(quarantine_uri)


def _inserted_rows(spark: SparkSession, target: str, before: int | None, after: int | None) -> int:
    if after is None or after == before:
        return 0
    summary = spark.sql(f"SELECT summary FROM {dotted_name(target)}.snapshots WHERE snapshot_id = {int(after)}").collect()[0]["summary"]
    return int(summary.get("added-records", 0))


def table_loaded(spark: SparkSession, target: str) -> bool:
    """Whether `target` exists and has a snapshot (a first load has committed)."""
    return spark.catalog.tableExists(dotted_name(target)) and current_snapshot_id(spark, target) is not None


def load_export_files(
    spark: SparkSession,
    spec: TableSpec,
    target: str,
    data_file_uris: list[str],
    quarantine_uri: str,
    exported_at: datetime,
) -> ExportLoadResult:
    """Loads exactly these export data files into `target` (a `namespace.table` in the default catalog)."""
    if spec.partition_column is None:
        raise ValueError(f"table {spec.table}: an export load needs a partition column for its match condition")
    ensure_table(spark, spec, target)
    result = ExportLoadResult(files=len(data_file_uris))
    if not data_file_uris:
        result.snapshot_id = current_snapshot_id(spark, target)
        return result

    checked = _check_files(spark, data_file_uris)
    result.bytes_read = sum(row["length"] for row in checked)
    corrupt = [row for row in checked if row["problem"]]
    result.corrupt_files = [row["path"] for row in corrupt]
    sound = [row["path"] for row in checked if not row["problem"]]
    records = _records(spec, _lines(spark, sound, result.corrupt_files), exported_at, datetime.now(timezone.utc)).persist()
    try:
        _load(spark, spec, target, records, result)
        if result.records_quarantined or corrupt:
            _quarantine(spark, records, corrupt, quarantine_uri)
            for row in corrupt:
                result.quarantine_reasons[row["problem"]] = result.quarantine_reasons.get(row["problem"], 0) + 1
    finally:
        records.unpersist()
    return result


def _load(spark: SparkSession, spec: TableSpec, target: str, records: DataFrame, result: ExportLoadResult) -> None:
    key, partition = spec.key.name, spec.partition_column.name
    # One pass for every count: kind and outcome of each line, and the span of the partition column.
    summary = records.groupBy("kind", "reason").agg(F.count("*").alias("count"), F.min(partition), F.max(partition)).collect()
    result.items_read = sum(row["count"] for row in summary)
    for row in summary:
        if row["reason"] is not None:
            result.quarantine_reasons[row["reason"]] = result.quarantine_reasons.get(row["reason"], 0) + row["count"]
    result.records_quarantined = sum(result.quarantine_reasons.values())
    result.deletes_ignored = sum(row["count"] for row in summary if row["kind"] == "delete" and row["reason"] is None)
    documents = [row for row in summary if row["reason"] is None and row["kind"] != "delete"]
    document_count = sum(row["count"] for row in documents)
    if not document_count:
        result.snapshot_id = current_snapshot_id(spark, target)
        return

    valid = records.where("reason IS NULL AND kind <> 'delete'")
    # Copies of one key within the batch: one is loaded, the others are duplicates (mutations if they differ).
    copies = {row[key]: row["copies"] for row in valid.groupBy(key).agg(F.count("*").alias("copies")).where("copies > 1").collect()}
    batch = valid
    if copies:
        repeated = valid.where(F.col(key).isin(list(copies)))
        versions = repeated.groupBy(key).agg(F.countDistinct(_document_fingerprint(ITEM_COLUMN)).alias("versions"))
        changed = sorted(row[key] for row in versions.where("versions > 1").collect())
        result.mutated_documents += len(changed)
        result.mutated_keys_sample += changed[:MUTATED_KEYS_SAMPLE]
        first = Window.partitionBy(key).orderBy("source_file", ITEM_COLUMN)
        batch = valid.withColumn("_copy", F.row_number().over(first)).where("_copy = 1").drop("_copy")
    distinct_documents = document_count - sum(count - 1 for count in copies.values())

    view = validate_identifier(f"{spec.table}_export_batch")
    batch.select(*spec.table_column_names).createOrReplaceTempView(view)
    before = current_snapshot_id(spark, target)
    spark.sql(insert_only_merge_sql(spec, target, view))
    result.snapshot_id = current_snapshot_id(spark, target)
    result.rows_inserted = _inserted_rows(spark, target, before, result.snapshot_id)
    result.duplicates_skipped = document_count - result.rows_inserted
    if result.rows_inserted < distinct_documents:
        _count_mutations(spark, spec, target, batch, documents, result)


def _count_mutations(spark: SparkSession, spec: TableSpec, target: str, batch: DataFrame, documents: list, result: ExportLoadResult) -> None:
    """Keys of the batch already in the table with other content (read only in the batch's partitions)."""
    key, partition = spec.key.name, spec.partition_column.name
    low = min(row[f"min({partition})"] for row in documents)
    high = max(row[f"max({partition})"] for row in documents) + timedelta(days=1)
    existing = (
        spark.table(dotted_name(target))
        .where(F.col(partition).between(F.lit(low.date()).cast("timestamp"), F.lit(high.date()).cast("timestamp")))
        .select(F.col(key), F.col(ITEM_COLUMN).alias("_stored_item"))
    )
    changed = (
        batch.join(existing, key)
        .where(_document_fingerprint(ITEM_COLUMN) != _document_fingerprint("_stored_item"))
        .select(key)
        .distinct()
    )
    keys = [row[key] for row in changed.limit(MUTATED_KEYS_SAMPLE).collect()]
    count = changed.count() if len(keys) == MUTATED_KEYS_SAMPLE else len(keys)
    result.mutated_documents += count
    result.mutated_keys_sample += [k for k in keys if k not in result.mutated_keys_sample][: MUTATED_KEYS_SAMPLE]
