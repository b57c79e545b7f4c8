"""Applies change files to an Iceberg table with one MERGE INTO (Spark only, no Dagster).

Guarantees:
- the latest change per key wins by stream sequence number; an older change never
  overwrites a newer one (the row keeps the sequence number it was written from);
- a deleted key is remembered in a tombstone table, so replaying an older insert or update
  for it (a retried run, a partly failed cleanup, a late file) never resurrects it;
- re-applying files that were already applied changes nothing;
- a bad record is quarantined with its reason, and everything else is applied.
"""

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from ddb_athena.lake.commit_properties import branch_summary, committed_with, compare_and_set_properties, empty_commit
from ddb_athena.lake.dynamodb_json import item_problem
from ddb_athena.lake.identifiers import dotted_name, qualified_name, string_literal, validate_identifier
from ddb_athena.lake.plan_settings import session_settings
from ddb_athena.lake.table_keys import Key, key_rows_schema, row_key
from ddb_athena.lake.table_spec import (
    CHANGED_AT_COLUMN,
    ITEM_COLUMN,
    METADATA_UPKEEP_PROPERTIES,
    SEQUENCE_BOUNDS_PROPERTY,
    SEQUENCE_COLUMN,
    SEQUENCE_DIGITS,
    SYNCED_AT_COLUMN,
    ColumnSpec,
    TableSpec,
    attributes_schema_ddl,
    create_table_sql,
    image_problem_sql,
    image_schema_ddl,
    key_match_sql,
    merge_sql,
    properties_sql,
    set_properties_sql,
    tombstone_table,
    type_mismatch_sql,
    typed_columns_sql,
    value_problem_cases,
)
from ddb_athena.lake.writer_branch import WriterBranch
from ddb_athena.streamed.capture.bootstrap import newer_than_applied, snapshot_group
from ddb_athena.streamed.capture.change_files import EVENT_NAMES, SNAPSHOT_KIND, is_change_file, parse_change_file_name

BOOTSTRAP_FILE_PROPERTY = "ddb_athena.bootstrap-file"
# The newest stream sequence number before the last bootstrap's scan: every change at or below it is older than the
# scan, which has seen its effect, so it is never applied again (a late file, a replayed batch, another host's file).
STREAM_FLOOR_PROPERTY = "ddb_athena.stream-floor"
# Where the in-process capture's stream positions are committed with the data: in the summary of each books commit
# that applies them (capture/checkpoints.py, CommittedCheckpoints).
STREAM_POSITIONS_PROPERTY = "ddb_athena.stream-positions"
# The typed columns whose values are in every row: a column added to a declaration joins them once its fill is
# published (add_columns).
FILLED_COLUMNS_PROPERTY = "ddb_athena.filled-columns"
# What each column's values were made from (JSON: name -> [attribute, transform]): a typed column declared to read
# another attribute, or to derive it otherwise into the same SQL type, is filled again from `item`; a key's is refused.
DERIVATIONS_PROPERTY = "ddb_athena.column-derivations"
# Sorts after every change file name: no snapshot row is applicable.
_NO_SNAPSHOT = "~"
# A stream batch is a few rows to a few thousand: one shuffle partition and a static plan (adaptive execution
# plans each stage again) cost ~10% less CPU per sync cycle (interleaved A/B in one warm session, docs/performance-log.md "CPU of a
# sync cycle"). A bootstrap's rebuild, the whole table, keeps the session's settings.
STREAM_BATCH_PLAN = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "1"}
# A large table's MERGE of the keys it holds broadcasts a batch up to 64 MB (cached, so its size is exact) to the table's
# scan; a larger one, a stream far behind, is shuffled with the table (slower, as right). A cycle at 230 writes/s holds
# ~10 MB, Spark's default limit. Not for one MERGE that also inserts: Spark would broadcast a small table instead, which
# cost a cycle of 100k rows 0.1 s more.
_BROADCAST_THE_BATCH = {"spark.sql.autoBroadcastJoinThreshold": str(64 << 20)}
# Below this many rows a cycle applies its batch in one MERGE that also inserts: sorting the table's keys costs CPU,
# the split's second commit costs dollars. At 1.27 M rows, 230 writes/s every 20 s within half a vCPU, the split took
# 26% less CPU (10.2 against 13.8 CPU-s a minute) and 2.3 s off the p95 (26.0 against 28.3 s), for 6.38 USD a month
# more on Spot (5.7 PUTs and 21 GETs a cycle more); at 10 M one MERGE spills its sort and its cycles run back to back
# (docs/performance-log.md, "The split at 1 GB" and "The MERGE of the keys held"). Two million keeps a 1 GB table,
# ~1.0-1.5 M rows, on the cheaper of the two while its p95 holds the targets.
ONE_MERGE_BELOW_ROWS = 2_000_000
ITEM_PROBLEM_FUNCTION = "ddb_athena_item_problem"
TOMBSTONE_PROPERTIES = dict((*METADATA_UPKEEP_PROPERTIES, SEQUENCE_BOUNDS_PROPERTY))
_ENVELOPE_SCHEMA = "event_name string, keys string, new_image string, sequence_number string, approximate_creation_time string"


@dataclass
class MergeResult:
    change_files: list[str]
    records_read: int = 0
    records_quarantined: int = 0
    records_superseded: int = 0
    changes: int = 0
    # Rows inserted or updated; rows deleted or replaced by an update (Iceberg's added records and position deletes).
    rows_written: int = 0
    rows_removed: int = 0
    # Changes not applied: older than a recorded delete of their key, or (an insert or update) than the row it holds.
    stale_skipped: int = 0
    # Keys whose newest change in the batch was quarantined: none of their changes was applied.
    keys_held: int = 0
    bootstrap_file: str | None = None
    snapshot_id: int | None = None
    newest_change_at: datetime | None = None
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    # Records applied whose typed attribute has another DynamoDB type than its column (the column is NULL, the item
    # whole): by reason, each also noted in the quarantine (without the record).
    type_mismatches: dict[str, int] = field(default_factory=dict)
    # Typed columns added to the table by this merge (a declaration that grew), filled from `item` in its publication.
    columns_added: list[str] = field(default_factory=list)


class SchemaChangeError(ValueError):
    """A declaration changed a table in a way Iceberg cannot follow in place (a column removed, a type narrowed)."""


def _newest_deletes_sql(spec: TableSpec, target: str) -> str:
    """The key columns and `_tombstone`: each deleted key's newest delete. Tombstones are appended (one row per delete
    applied), so that is its highest sequence number."""
    keys = ", ".join(spec.key_names)
    return f"SELECT {keys}, max({SEQUENCE_COLUMN}) AS _tombstone FROM {dotted_name(tombstone_table(target))} GROUP BY {keys}"


def tombstone_versions(spark: SparkSession, spec: TableSpec, target: str, keys: set[Key]) -> dict[Key, str]:
    """The sequence number of the newest delete of each of `keys` (table_keys.py) that was ever deleted from the table."""
    wanted = spark.createDataFrame(sorted(keys), key_rows_schema(spec))
    newest = spark.sql(_newest_deletes_sql(spec, target)).join(F.broadcast(wanted), spec.key_names)
    return {row_key(spec, row): row["_tombstone"] for row in newest.collect()}


def ensure_table(spark: SparkSession, spec: TableSpec, target: str) -> list[ColumnSpec]:
    """Creates the namespace and the table of `spec` if they do not exist, and brings its properties up to the spec.
    Returns the typed columns the declaration added since (`add_columns` adds and fills them, after the writer took
    the table); a column removed or a type changed is refused (SchemaChangeError)."""
    namespace = qualified_name(*target.split(".")[:-1])
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
    spark.sql(create_table_sql(spec, target))
    properties = table_properties(spark, target)
    existing = {column.name: column.dataType.simpleString() for column in spark.table(dotted_name(target)).schema.fields}
    # A table made before columns were recorded as filled: every column it has was filled when it was created.
    filled = set(properties[FILLED_COLUMNS_PROPERTY].split(",")) if FILLED_COLUMNS_PROPERTY in properties else set(existing)
    _refuse_what_iceberg_cannot_follow(spec, target, existing)
    # A table made before derivations were recorded: its columns as declared now (there is nothing to compare with).
    recorded = json.loads(properties.get(DERIVATIONS_PROPERTY, "{}"))
    derivations = {column.name: recorded.get(column.name, column.derivation) for column in spec.all_columns if column.name in filled & set(existing)}
    for column in spec.key_columns:
        if derivations.get(column.name, column.derivation) != column.derivation:
            raise SchemaChangeError(
                f"{target}: key column {column.name} was made from attribute {derivations[column.name][0]!r} "
                f"({derivations[column.name][1]}), its declaration says {column.attribute!r} ({column.transform}). " + _NEW_TABLE_FOR_A_NEW_KEY
            )
    rederived = [column for column in spec.columns if column.name in derivations and derivations[column.name] != column.derivation]
    _bring_properties_up_to(
        spark,
        target,
        {
            **dict(spec.properties),
            FILLED_COLUMNS_PROPERTY: ",".join(sorted(filled & set(existing))),
            DERIVATIONS_PROPERTY: json.dumps(derivations, sort_keys=True, ensure_ascii=False),
        },
    )
    return [column for column in spec.columns if column.name not in filled] + rederived


_NEW_TABLE_FOR_A_NEW_KEY = (
    "A table's key never changes in place (the rows of one key would be several, or one): declare a new iceberg_table with "
    "the new key, and bootstrap it (streamed) or load it (exported); the old table stays readable until you drop it"
)


def _refuse_what_iceberg_cannot_follow(spec: TableSpec, target: str, existing: dict[str, str]) -> None:
    missing_keys = [column.name for column in spec.key_columns if column.name not in existing]
    if missing_keys:
        never = ", ".join(missing_keys)
        raise SchemaChangeError(f"{target}: its declaration's key has {never}, which the table's rows were never keyed by. " + _NEW_TABLE_FOR_A_NEW_KEY)
    declared = {column.name: column for column in spec.all_columns}
    sync = {name for name, _, _ in spec.sync_columns}
    for name, sql_type in existing.items():
        if name in sync:
            continue
        if name not in declared:
            raise SchemaChangeError(
                f"{target}: column {name} ({sql_type}) is not in the declaration of {spec.table} any more. A column is never removed "
                "(queries and older snapshots read it): declare it again; to be rid of it, declare a new iceberg_table and bootstrap that"
            )
        if declared[name].sql_type != sql_type:
            raise SchemaChangeError(
                f"{target}: column {name} is {sql_type}, its declaration says {declared[name].sql_type}. A column's type never changes in "
                f"place (its values would be read as the new type): declare it as {sql_type} again, or declare a column of another name"
            )


def add_columns(spark: SparkSession, spec: TableSpec, target: str, ref: str, columns: list[ColumnSpec], quarantine_uri: str) -> dict[str, int]:
    """Adds the declared `columns` to `target` (those it has not: a column declared to be made otherwise is there) and
    fills them for every existing row from its `item`, the fill committed to `ref` (the writer's branch: it reaches
    readers in the writer's next publication; the schema itself is the table's at once, so until then the new columns
    read NULL on every row, never on some). Recorded as filled only once published (`record_filled`): a writer fenced
    before that leaves them to be filled by the next. A row whose attribute has another DynamoDB type than its column is
    filled NULL and noted in the quarantine by its reason, as an incoming change is. -> those reasons, counted."""
    existing = set(spark.table(dotted_name(target)).columns)
    new = [column for column in columns if column.name not in existing]
    if new:
        spark.sql(f"ALTER TABLE {dotted_name(target)} ADD COLUMNS ({', '.join(f'{column.name} {column.sql_type}' for column in new)})")
    image = f"from_json({ITEM_COLUMN}, {string_literal(attributes_schema_ddl(columns))}) AS image"
    sequence = SEQUENCE_COLUMN if SEQUENCE_COLUMN in spec.table_column_names else "CAST(NULL AS string)"
    filled = spark.sql(
        f"SELECT {', '.join(spec.key_names)}, {', '.join(typed_columns_sql(columns, 'image'))}, "
        f"{type_mismatch_sql(columns, ITEM_COLUMN)} AS type_mismatch, {sequence} AS sequence_number FROM (SELECT *, {image} FROM {ref})"
    ).persist()
    try:
        mismatches = {row["type_mismatch"]: row["count"] for row in filled.where("type_mismatch IS NOT NULL").groupBy("type_mismatch").count().collect()}
        if mismatches:
            notes = filled.where("type_mismatch IS NOT NULL").selectExpr(
                f"{string_literal(f'the fill of {target}')} AS source_file", "type_mismatch AS reason", "sequence_number"
            )
            notes.coalesce(1).write.mode("append").json(quarantine_uri)
        view = validate_identifier(f"{spec.table}_filled_columns")  # one a table: tables are merged side by side
        filled.createOrReplaceTempView(view)
        any_value = " OR ".join(f"s.{column.name} IS NOT NULL" for column in columns)
        # A column made otherwise is set on every row (NULL where it no longer has a value), a new one where it has one.
        refill = " OR ".join(f"t.{column.name} IS NOT NULL" for column in columns if column.name not in {added.name for added in new})
        spark.sql(
            f"MERGE INTO {ref} t USING {view} s ON {key_match_sql(spec, 't', 's')} "
            f"WHEN MATCHED AND ({any_value}{' OR ' + refill if refill else ''}) "
            f"THEN UPDATE SET {', '.join(f't.{column.name} = s.{column.name}' for column in columns)}"
        )
    finally:
        filled.unpersist()
    return mismatches


def record_filled(spark: SparkSession, target: str, columns: list[ColumnSpec]) -> None:
    """After the publication of `add_columns`' fill: those columns are whole, made as declared."""
    properties = table_properties(spark, target)
    filled = set(filter(None, properties.get(FILLED_COLUMNS_PROPERTY, "").split(","))) | {column.name for column in columns}
    derivations = {**json.loads(properties.get(DERIVATIONS_PROPERTY, "{}")), **{column.name: column.derivation for column in columns}}
    spark.sql(
        set_properties_sql(
            target, {FILLED_COLUMNS_PROPERTY: ",".join(sorted(filled)), DERIVATIONS_PROPERTY: json.dumps(derivations, sort_keys=True, ensure_ascii=False)}
        )
    )


def _bring_properties_up_to(spark: SparkSession, target: str, properties: dict[str, str]) -> None:
    # A table created by an earlier version takes the current properties (write tuning, metadata upkeep).
    current = table_properties(spark, target)
    stale = {name: value for name, value in properties.items() if current.get(name) != value}
    if stale:
        spark.sql(set_properties_sql(target, stale))


def ensure_tables(spark: SparkSession, spec: TableSpec, target: str) -> list[ColumnSpec]:
    """The table and its tombstones; the typed columns to add (see ensure_table)."""
    additions = ensure_table(spark, spec, target)
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {dotted_name(tombstone_table(target))} "
        f"({key_rows_schema(spec)}, {SEQUENCE_COLUMN} string, deleted_at timestamp) USING iceberg "
        f"TBLPROPERTIES ({properties_sql({'format-version': '2', 'write.merge.mode': 'merge-on-read', **TOMBSTONE_PROPERTIES})})"
    )
    _bring_properties_up_to(spark, tombstone_table(target), TOMBSTONE_PROPERTIES)
    return additions


def table_exists(spark: SparkSession, target: str) -> bool:
    return spark.catalog.tableExists(dotted_name(target))


def warm_up(spark: SparkSession, target: str) -> None:
    """Loads what a writer's first cycle would (the catalog, the table's metadata, its scan's classes) and writes
    nothing: a new JVM's first MERGE is several times slower than the next."""
    if table_exists(spark, target):
        spark.table(dotted_name(target)).limit(1).collect()


def current_snapshot_id(spark: SparkSession, target: str) -> int | None:
    return snapshot_id_of(table_properties(spark, target))


def snapshot_id_of(properties: dict[str, str]) -> int | None:
    # Iceberg's Spark table lists its current snapshot among its properties: no scan of the snapshots table.
    value = properties.get("current-snapshot-id", "none")
    return None if value == "none" else int(value)


def table_properties(spark: SparkSession, target: str) -> dict[str, str]:
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES {dotted_name(target)}").collect()}


def sequence_before_sql(column: str) -> str:
    """The sequence number just below `column`'s (40 digits, zero-padded): in two halves of 20, each a decimal Spark
    holds exactly (38 digits at most), the low half borrowing from the high one."""
    column = validate_identifier(column)
    high, low = f"left({column}, 20)", f"right({column}, 20)"
    return (
        f"CASE WHEN {low} = repeat('0', 20) "
        f"THEN concat(lpad(CAST(CAST({high} AS DECIMAL(20, 0)) - 1 AS STRING), 20, '0'), repeat('9', 20)) "
        f"ELSE concat({high}, lpad(CAST(CAST({low} AS DECIMAL(20, 0)) - 1 AS STRING), 20, '0')) END"
    )


def _tombstones_of(changes: DataFrame, spec: TableSpec) -> DataFrame:
    """Tombstone rows (the tombstone table's columns) for the REMOVE changes among `changes`, and for each key dropped
    for its quarantined newest change (`_held`) one just below that change: every older change of the key is buried
    (a late or replayed one would bring back a state readers saw replaced), the change itself, fixed and written
    again, still applies."""
    deleted_at = F.col(CHANGED_AT_COLUMN).alias("deleted_at")
    removes = changes.where("event_name = 'REMOVE' AND NOT _held").select(*spec.key_names, SEQUENCE_COLUMN, deleted_at)
    holds = changes.where("_held").select(*spec.key_names, F.expr(sequence_before_sql(SEQUENCE_COLUMN)).alias(SEQUENCE_COLUMN), deleted_at)
    return removes.unionByName(holds)


def _validated_changes_sql(spec: TableSpec, lines_view: str) -> str:
    """Every line of the change files in `lines_view` (a text scan) with its parsed fields and the reason it
    cannot be applied (NULL if it can). One SQL text, not a chain of DataFrame calls: each of those is a py4j
    round trip, ~160 of them a sync cycle (docs/performance-log.md, "Python's calls into the JVM")."""
    events = ", ".join(f"'{name}'" for name in EVENT_NAMES)
    # Each key attribute from the record's Keys (a REMOVE has no image), typed as its column: a key that is missing or
    # that its column cannot hold exactly is the record's problem, never a rounded or empty key.
    key_problems = " ".join(value_problem_cases(spec.key_columns, "key_values", required=set(spec.key_columns), missing="missing key attribute"))
    envelope_problem = (
        "CASE "
        "WHEN get_json_object(line, '$') IS NULL THEN 'not valid JSON' "
        f"WHEN event_name IS NULL OR event_name NOT IN ({events}) THEN 'missing or unknown event_name' "
        f"WHEN sequence_number IS NULL OR NOT sequence_number RLIKE '^[0-9]{{1,{SEQUENCE_DIGITS}}}$' THEN 'missing or malformed sequence_number' "
        f"{key_problems} "
        "WHEN try_cast(approximate_creation_time AS timestamp) IS NULL THEN 'missing or malformed approximate_creation_time' "
        "WHEN new_image IS NULL AND event_name <> 'REMOVE' THEN 'missing new_image' "
        "ELSE NULL END"
    )
    lines = f"SELECT input_file_name() AS source_file, value AS line FROM {validate_identifier(lines_view)}"
    envelopes = (
        "SELECT source_file, regexp_extract(source_file, '([^/]+)$', 1) AS file_name, line, "
        f"from_json(line, {string_literal(_ENVELOPE_SCHEMA)}) AS envelope FROM ({lines}) WHERE trim(line) <> ''"
    )
    fields = (
        f"SELECT source_file, file_name, line, envelope.*, from_json(envelope.new_image, {string_literal(image_schema_ddl(spec))}) AS image, "
        f"from_json(envelope.keys, {string_literal(attributes_schema_ddl(spec.key_columns))}) AS key_values FROM ({envelopes})"
    )
    return (
        "SELECT source_file, file_name, line, event_name, keys, new_image, sequence_number, approximate_creation_time, image, "
        f"{', '.join(typed_columns_sql(spec.key_columns, 'key_values'))}, "
        f"CASE WHEN event_name <> 'REMOVE' THEN {type_mismatch_sql(spec.columns, 'new_image')} END AS type_mismatch, "
        f"coalesce(envelope_problem, {ITEM_PROBLEM_FUNCTION}(new_image), CASE WHEN event_name <> 'REMOVE' THEN {image_problem_sql(spec)} END) "
        f"AS reason FROM (SELECT *, {envelope_problem} AS envelope_problem FROM ({fields}))"
    )


def _with_item_problem_function(spark: SparkSession) -> None:
    # Registered once per session: a registration is a dozen py4j calls.
    if not spark.catalog.functionExists(ITEM_PROBLEM_FUNCTION):
        spark.udf.register(ITEM_PROBLEM_FUNCTION, item_problem, StringType())


def _utc(moment: datetime | None) -> datetime | None:
    # The session time zone is UTC, so Spark's naive timestamps are UTC.
    return moment.replace(tzinfo=UTC) if moment else None


def _applicable_sql() -> str:
    """Whether a readable record may be applied: a stream change newer than `:floor` (the stream's end before the last
    scan), or a row of the snapshot being applied (named from `:first_file` on; its rows carry that floor)."""
    return f"((event_name = 'SNAPSHOT' AND file_name >= :first_file) OR (event_name <> 'SNAPSHOT' AND lpad(sequence_number, {SEQUENCE_DIGITS}, '0') > :floor))"


def _ranked_changes_sql(spec: TableSpec, validated_view: str) -> str:
    """Every applicable change (see _applicable_sql) whose key and sequence number can be read, quarantined or not,
    typed and ranked per key: `_rank` 1 is the change with the highest stream sequence number (ties: the later file).
    A key whose newest change is quarantined is dropped (see _latest_changes_sql)."""
    # The key comes from the record's Keys: a REMOVE has no image to take it from.
    typed = [
        "event_name",
        "file_name",
        "reason",
        *spec.key_names,
        *typed_columns_sql(spec.columns, "image"),
        f"new_image AS {ITEM_COLUMN}",
        f"lpad(sequence_number, {SEQUENCE_DIGITS}, '0') AS {SEQUENCE_COLUMN}",
        f"CAST(approximate_creation_time AS timestamp) AS {CHANGED_AT_COLUMN}",
    ]
    # A key its columns cannot hold exactly is NULL in them: such a record names no key, and holds none.
    readable = " AND ".join([*(f"{name} IS NOT NULL" for name in spec.key_names), f"sequence_number RLIKE '^[0-9]{{1,{SEQUENCE_DIGITS}}}$'"])
    changes = f"SELECT {', '.join(typed)} FROM {validate_identifier(validated_view)} WHERE {readable} AND {_applicable_sql()}"
    keys = ", ".join(spec.key_names)
    return f"SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY {SEQUENCE_COLUMN} DESC, file_name DESC) AS _rank FROM ({changes})"


def _latest_changes_sql(spec: TableSpec, validated_view: str) -> str:
    """One row per key of the applicable changes, typed: the newest change of each key (see _ranked_changes_sql), with
    the merge time `:synced_at`. A key whose newest change is quarantined (`_held`) is dropped from the table: none of
    its older changes is applied (each would present a state the key has already left), and its row is removed, like a
    delete but without a tombstone (the change, once fixed and written again, must still apply).

    The merge time joins as data (a one-row VALUES relation), not as a literal: Spark inlines timestamp literals
    into the Java it generates, so a new literal every cycle meant new classes to compile and JIT every cycle
    (about a fifth of a warm sync run's CPU)."""
    names = ["file_name", *spec.key_names, *(column.name for column in spec.columns), ITEM_COLUMN, SEQUENCE_COLUMN, CHANGED_AT_COLUMN]
    held = "CASE WHEN reason IS NULL THEN event_name ELSE 'REMOVE' END AS event_name, reason IS NOT NULL AS _held"
    merged_at = f"SELECT CAST(col1 AS timestamp) AS {SYNCED_AT_COLUMN} FROM VALUES (:synced_at)"
    ranked = _ranked_changes_sql(spec, validated_view)
    return f"SELECT {', '.join(names)}, {held}, {SYNCED_AT_COLUMN} FROM ({ranked}) CROSS JOIN ({merged_at}) WHERE _rank = 1"


def merge_change_files(
    spark: SparkSession,
    spec: TableSpec,
    target: str,
    change_file_uris: list[str],
    quarantine_uri: str,
    ensure: bool = True,
    writer: WriterBranch | None = None,
    snapshot_position: str | None = None,
    commit_properties: dict[str, str] | None = None,
) -> MergeResult:
    """Applies exactly the given change files to `target` (a `namespace.table` in the default catalog).

    `ensure=False` skips creating the tables and updating their properties: a caller that merges every few
    seconds does that once. With a `writer`, the table and its tombstones are read and written on that writer's
    branch and published at the end (writer_branch.py): a writer whose lease was taken publishes nothing. Without
    one, they are written on `main` (a single writer that no other can take over: tests, benchmarks).
    `snapshot_position` is the stream's end before the newest snapshot's scan, when the batch holds one (from its
    seal: an empty table's snapshot has no row to carry it); without it, its rows' own sequence number.
    `commit_properties` are committed with the merge, in the summary of the commit that publishes it (the stream
    positions it covers): a merge that changes no row commits them in a snapshot of their own."""
    additions = ensure_tables(spark, spec, target) if ensure else []
    tables = _Tables(target, writer)
    result = MergeResult(change_files=list(change_file_uris))
    # The writer's epoch in every data commit too: snapshot expiry never leaves main without the newest one.
    data_properties = {**(commit_properties or {}), **(writer.commit_properties if writer is not None else {})}
    if additions:
        # After the writer took the table: a writer of the older declaration is fenced, and publishes nothing more.
        with committed_with(spark, data_properties):
            result.type_mismatches = add_columns(spark, spec, target, tables.table, additions, quarantine_uri)
        tables.written.add(target)
        tables.additions = additions
        result.columns_added = [column.name for column in additions]
    if not change_file_uris:
        return _with_snapshot(spark, target, tables.carry(spark, commit_properties, result))

    _with_item_problem_function(spark)
    lines_view, validated_view = validate_identifier(f"{spec.table}_change_lines"), validate_identifier(f"{spec.table}_validated_changes")
    spark.read.text(change_file_uris).createOrReplaceTempView(lines_view)
    validated = spark.sql(_validated_changes_sql(spec, lines_view)).persist()
    validated.createOrReplaceTempView(validated_view)
    try:
        # A snapshot (its seal and parts) replaces everything older than its scan (see capture/bootstrap.py).
        properties = table_properties(spark, target)
        cutoff = properties.get(BOOTSTRAP_FILE_PROPERTY) or ""
        first_file, result.bootstrap_file = _newest_snapshot(change_file_uris, cutoff)
        first_file = first_file or _NO_SNAPSHOT
        # Below every sequence number until a bootstrap sets it.
        floor = properties.get(STREAM_FLOOR_PROPERTY) or ""
        if result.bootstrap_file:
            floor = max(floor, _sequence(snapshot_position) if snapshot_position else _snapshot_rows_position(spark, validated_view, first_file))
        selection = {"first_file": first_file, "floor": floor}
        # One pass for every count this function needs: per file, outcome and kind of record.
        with session_settings(spark, STREAM_BATCH_PLAN):
            summary = spark.sql(
                f"SELECT file_name, reason, type_mismatch, count(*) AS count, count_if({_applicable_sql()}) AS applicable, "
                f"min(CASE WHEN {_applicable_sql()} THEN lpad(sequence_number, {SEQUENCE_DIGITS}, '0') END) AS oldest "
                f"FROM {validated_view} GROUP BY file_name, reason, type_mismatch",
                args=selection,
            ).collect()
        result.records_read = sum(row["count"] for row in summary)
        for row in summary:
            if row["reason"] is not None:
                result.quarantine_reasons[row["reason"]] = result.quarantine_reasons.get(row["reason"], 0) + row["count"]
            elif row["type_mismatch"] is not None:
                result.type_mismatches[row["type_mismatch"]] = result.type_mismatches.get(row["type_mismatch"], 0) + row["count"]
        result.records_quarantined = sum(result.quarantine_reasons.values())
        if result.records_quarantined or result.type_mismatches:
            # A record that cannot be applied, whole (to fix and write again); a type mismatch only by its reason and
            # stream position: the record is applied, its item whole in the table.
            bad = validated.where("reason IS NOT NULL OR type_mismatch IS NOT NULL").selectExpr(
                "source_file", "CASE WHEN reason IS NOT NULL THEN line END AS line", "coalesce(reason, type_mismatch) AS reason", "sequence_number"
            )
            bad.coalesce(1).write.mode("append").json(quarantine_uri)

        applicable_rows = [row for row in summary if row["reason"] is None and row["applicable"]]
        applicable = sum(row["applicable"] for row in applicable_rows)
        result.records_superseded = result.records_read - result.records_quarantined - applicable
        if result.records_quarantined:
            held = spark.sql(
                f"SELECT count(*) AS held FROM ({_ranked_changes_sql(spec, validated_view)}) WHERE _rank = 1 AND reason IS NOT NULL",
                args=selection,
            )
            result.keys_held = held.collect()[0]["held"]
        # A key held by its quarantined newest change is dropped whether or not the batch has anything else to apply.
        if not applicable and not result.bootstrap_file and not result.keys_held:
            return _with_snapshot(spark, target, tables.carry(spark, commit_properties, result))

        synced_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        latest = spark.sql(_latest_changes_sql(spec, validated_view), args={**selection, "synced_at": synced_at})
        with committed_with(spark, data_properties):
            if result.bootstrap_file:
                _rebuild(spark, spec, tables, latest, result)
            else:
                with session_settings(spark, STREAM_BATCH_PLAN):
                    _upsert(spark, spec, tables, latest, min(row["oldest"] for row in summary if row["applicable"]), result)
        tables.carry(spark, commit_properties, result)
        # Only once the rebuild is visible: which snapshot it applied, and the floor below which no change applies.
        # Never lowered, by a compare-and-set: a writer frozen before this, resumed after a newer bootstrap, leaves the
        # newer floor (properties commit to `main`, outside the fence).
        if result.bootstrap_file:
            applied = {BOOTSTRAP_FILE_PROPERTY: result.bootstrap_file, STREAM_FLOOR_PROPERTY: floor}
            compare_and_set_properties(spark, target, lambda current: applied if floor >= (current.get(STREAM_FLOOR_PROPERTY) or "") else None)
    finally:
        validated.unpersist()
    return _with_snapshot(spark, target, result)


def _sequence(number: str) -> str:
    """A stream sequence number as the table stores it (zero-padded, so that text order is number order)."""
    if not number.isdigit() or len(number) > SEQUENCE_DIGITS:
        raise ValueError(f"{number!r} is not a stream sequence number")
    return number.zfill(SEQUENCE_DIGITS)


def _snapshot_rows_position(spark: SparkSession, validated_view: str, first_file: str) -> str:
    """The sequence number the newest snapshot's rows carry (the stream's end before its scan); 0 if it has none."""
    rows = spark.sql(
        f"SELECT max(lpad(sequence_number, {SEQUENCE_DIGITS}, '0')) AS position FROM {validate_identifier(validated_view)} "
        "WHERE event_name = 'SNAPSHOT' AND file_name >= :first_file AND reason IS NULL",
        args={"first_file": first_file},
    ).collect()
    return rows[0]["position"] or _sequence("0")


def _newest_snapshot(change_file_uris: list[str], cutoff: str) -> tuple[str | None, str | None]:
    """The first and last file names of the newest snapshot named after `cutoff` (its seal, then its parts), from the
    names alone: an empty table's snapshot has no records, and still replaces the table."""
    names = [uri.rsplit("/", 1)[-1] for uri in change_file_uris]
    snapshots = [name for name in names if parse_change_file_name(name)[1] == SNAPSHOT_KIND and newer_than_applied(name, cutoff)]
    if not snapshots:
        return None, None
    newest = max(snapshot_group(name) for name in snapshots)
    members = [name for name in snapshots if snapshot_group(name) == newest]
    return min(members), max(members)


def _with_snapshot(spark: SparkSession, target: str, result: MergeResult) -> MergeResult:
    result.snapshot_id = current_snapshot_id(spark, target)
    return result


class _Tables:
    """The names a merge reads and writes the table and its tombstones by: the writer's branch, or `main`."""

    def __init__(self, target: str, writer: WriterBranch | None):
        self.target, self.writer = target, writer
        if writer is not None:
            writer.take(target)
            writer.take(tombstone_table(target))
        ref = writer.ref if writer is not None else dotted_name
        self.table, self.tombstones = ref(target), ref(tombstone_table(target))
        # What this merge committed to: a table it left alone needs no publication (each is a metadata commit).
        self.written: set[str] = set()
        # Columns this merge added and filled: recorded as filled once published.
        self.additions: list[ColumnSpec] = []

    def carry(self, spark: SparkSession, commit_properties: dict[str, str] | None, result: MergeResult) -> MergeResult:
        """Publishes what this merge wrote, with `commit_properties` in the table's commit: a merge that did not write
        the table (nothing applicable, or deletes of keys it does not hold) commits them in an empty snapshot."""
        if commit_properties and self.target not in self.written:
            empty_commit(spark, self.target, commit_properties, branch=self.writer.name if self.writer is not None else "main")
            self.written.add(self.target)
        self.publish()
        if self.additions:
            record_filled(spark, self.target, self.additions)
            self.additions = []
        return result

    def publish(self) -> None:
        """The tables this merge wrote, tombstones first: a delete is known before the rows it removed are gone."""
        if self.writer is not None:
            for name in (tombstone_table(self.target), self.target):
                if name in self.written:
                    self.writer.publish(name)


def unburied_sql(spec: TableSpec, latest_view: str, tombstones: str) -> str:
    """Each change of `latest_view` (none older than `:oldest`) with `_buried`: whether a recorded delete of its key is
    as new as it or newer (it was applied already, or is older than that delete). The lookup is on the batch's side:
    only deletes as new as the batch's oldest change can bury one, and the bound lets Iceberg skip the files of older
    ones (a semi join, not the newest delete per key: that aggregate put a shuffle in every cycle)."""
    return (
        f"SELECT l.*, EXISTS (SELECT 1 FROM {dotted_name(tombstones)} d WHERE {key_match_sql(spec, 'd', 'l')} "
        f"AND d.{SEQUENCE_COLUMN} >= l.{SEQUENCE_COLUMN} AND d.{SEQUENCE_COLUMN} >= :oldest) AS _buried "
        f"FROM {validate_identifier(latest_view)} l"
    )


def _upsert(spark: SparkSession, spec: TableSpec, tables: _Tables, latest: DataFrame, oldest_sequence: str, result: MergeResult) -> None:
    """Applies `latest` (one change per key, none older than `oldest_sequence`) to the table and its tombstones.

    The batch goes to the table by `_apply` (one MERGE on a small table; a large one's MERGE of the keys it holds,
    then an append). The MERGE's conditions decide against the row it finds (a change not newer than the row is skipped).
    Every delete not recorded yet is recorded as a tombstone, also one of a key the table no longer holds or holds
    newer: such a tombstone is older than the row, so it buries only changes the row's own sequence number already
    refuses. The counts are Iceberg's own, from the commits' summaries: rows written (inserted or updated) and rows
    removed (deleted, or replaced by an update)."""
    latest_view = validate_identifier(f"{spec.table}_latest_changes")
    latest.createOrReplaceTempView(latest_view)
    # Checkpointed: computed once, whatever the cycle then commits (a write makes Spark compute again every plan that
    # reads the table written).
    changes = spark.sql(unburied_sql(spec, latest_view, tables.tombstones), args={"oldest": oldest_sequence}).localCheckpoint()
    summary = changes.groupBy("_buried", "event_name", "_held").agg(F.count("*").alias("count"), F.max(CHANGED_AT_COLUMN).alias("newest")).collect()
    result.changes = sum(row["count"] for row in summary)
    result.newest_change_at = _utc(max((row["newest"] for row in summary if row["newest"]), default=None))
    unburied = [row for row in summary if not row["_buried"]]
    # A held key's tombstone too (its event is REMOVE).
    deletes = sum(row["count"] for row in unburied if row["event_name"] == "REMOVE")
    upserts = sum(row["count"] for row in unburied if row["event_name"] != "REMOVE")

    # Tombstones first: if the run dies between the commits, the retry still knows the delete (and appends
    # it again, which changes no key's newest delete). An append, not a MERGE: no join, a third of the jobs.
    if deletes:
        _tombstones_of(changes.where("NOT _buried"), spec).writeTo(tables.tombstones).append()
        tables.written.add(tombstone_table(tables.target))
    # A delete goes to the MERGE even when recorded already: the run that recorded it may have died before its
    # MERGE, and removing a row older than a delete is always right.
    if upserts or any(row["event_name"] == "REMOVE" for row in summary):
        _apply(spark, spec, tables, changes.where("NOT _buried OR event_name = 'REMOVE'"), oldest_sequence, result)
    # Inserts and updates older than a recorded delete or the row, and deletes recorded already.
    result.stale_skipped = result.changes - sum(row["count"] for row in unburied) + upserts - result.rows_written


def _apply(spark: SparkSession, spec: TableSpec, tables: _Tables, changes: DataFrame, oldest_sequence: str, result: MergeResult) -> None:
    """Applies `changes` (none older than `oldest_sequence`) to the rows of their keys (a change newer than its row).
    A table of fewer than ONE_MERGE_BELOW_ROWS rows in one MERGE that also inserts; a larger one in a MERGE of the keys
    it holds, then an append of the other keys' inserts and updates: two commits on the writer's branch, published
    together (without a writer, on `main`: a reader may see the first alone). A run that dies between them leaves the
    second to its retry, which finds the first's rows as new as their changes."""
    view = validate_identifier(f"{spec.table}_changes")
    changes.createOrReplaceTempView(view)
    if int(_summary_of(spark, tables).get("total-records", 0)) < ONE_MERGE_BELOW_ROWS:
        _merge(spark, spec, tables, view, result, insert_new=True)
        return
    # Cached and counted before the MERGE is planned: a cached batch's size is exact once computed, so Spark broadcasts it
    # to the table's scan (planned before, its size is unknown, and Spark shuffles and sorts the table instead).
    changes.persist().count()
    try:
        _merge(spark, spec, tables, view, result, insert_new=False)
        # Checkpointed, as the batch: the append must not make Spark look again.
        new = spark.sql(absent_keys_sql(spec, view, tables.table), args={"oldest": oldest_sequence}).localCheckpoint()
    finally:
        changes.unpersist()
    inserted = new.count()
    if inserted:
        new.writeTo(tables.table).append()
        tables.written.add(tables.target)
        result.rows_written += inserted


def absent_keys_sql(spec: TableSpec, changes_view: str, table: str) -> str:
    """The table's columns of each insert or update of `changes_view` (none older than `:oldest`) whose key the table
    does not hold as new as the change. After a MERGE of the keys the table holds, a key it holds has a row at least as
    new as its change (updated by it, or newer already), so these are the keys it does not hold: the table's one scan a
    cycle is the MERGE's. The bound lets Iceberg skip every file older than the batch (its sequence numbers' exact
    bounds, SEQUENCE_BOUNDS_PROPERTY): this reads the MERGE's new rows, not the table."""
    return (
        f"SELECT {', '.join(spec.table_column_names)} FROM {validate_identifier(changes_view)} c "
        f"WHERE event_name <> 'REMOVE' AND NOT _buried AND NOT EXISTS (SELECT 1 FROM {dotted_name(table)} t "
        f"WHERE {key_match_sql(spec, 't', 'c')} AND t.{SEQUENCE_COLUMN} >= c.{SEQUENCE_COLUMN} AND t.{SEQUENCE_COLUMN} >= :oldest)"
    )


def _merge(spark: SparkSession, spec: TableSpec, tables: _Tables, view: str, result: MergeResult, insert_new: bool) -> None:
    with session_settings(spark, {} if insert_new else _BROADCAST_THE_BATCH):
        spark.sql(merge_sql(spec, tables.table, view, insert_new))
    tables.written.add(tables.target)
    merged = _summary_of(spark, tables)
    result.rows_written += int(merged.get("added-records", 0))
    result.rows_removed += int(merged.get("added-position-deletes", 0))


def _summary_of(spark: SparkSession, tables: _Tables) -> dict[str, str]:
    """The summary of the table's head on the branch this merge writes (the writer's, or `main`): after a commit, its."""
    return branch_summary(spark, tables.target, tables.writer.name if tables.writer is not None else "main")


def _rebuild(spark: SparkSession, spec: TableSpec, tables: _Tables, latest: DataFrame, result: MergeResult) -> None:
    """Replaces the table with the snapshot plus the changes after it, in one atomic overwrite."""
    target_sql, tombstones_sql = tables.table, tables.tombstones
    if not is_change_file(result.bootstrap_file):
        raise ValueError(f"{result.bootstrap_file!r} is not a change file name")
    latest = latest.localCheckpoint()
    live = latest.where("event_name <> 'REMOVE'").select(*spec.table_column_names)
    # Every row of the snapshot written, every row of the table it replaces removed.
    result.rows_written, result.rows_removed = live.count(), spark.table(target_sql).count()
    result.changes, newest = latest.agg(F.count("*"), F.max(CHANGED_AT_COLUMN)).collect()[0]
    result.newest_change_at = _utc(newest)
    removes = _tombstones_of(latest, spec)
    removes.writeTo(tombstones_sql).overwrite(F.lit(True))
    live.writeTo(target_sql).overwrite(F.lit(True))
    tables.written.update((tables.target, tombstone_table(tables.target)))
