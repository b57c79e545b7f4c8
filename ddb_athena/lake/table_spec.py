"""Table specs: which DynamoDB attributes become which typed Iceberg columns, and the SQL for them.

Everything that depends on a table's shape is generated here from a spec, so that another
table is one spec away. Every name is validated before it reaches SQL.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ddb_athena.lake.identifiers import InvalidIdentifierError, dotted_name, validate_identifier

# transform -> (DynamoDB type tag it reads, Iceberg/Spark SQL type or None when it takes a parameter)
TRANSFORMS = {
    "string": ("S", "string"),
    "decimal": ("N", None),
    "epoch_nanos_timestamp": ("N", "timestamp"),
    "iso_timestamp": ("S", "timestamp"),
    "boolean": ("BOOL", "boolean"),
    "json_list": ("L", "string"),
    "json_map": ("M", "string"),
}

# Columns every synced table carries besides the typed ones: name, type, comment.
ITEM_COLUMN = "item"
SEQUENCE_COLUMN = "_sequence_number"
CHANGED_AT_COLUMN = "_changed_at"
SYNCED_AT_COLUMN = "_synced_at"
SYNC_COLUMNS = (
    (ITEM_COLUMN, "string", "the whole item as DynamoDB JSON: every attribute, exact types"),
    (SEQUENCE_COLUMN, "string", "stream sequence number of the last applied change, zero-padded"),
    (CHANGED_AT_COLUMN, "timestamp", "approximate time of the last applied change in DynamoDB"),
    (SYNCED_AT_COLUMN, "timestamp", "when the change was merged into this table"),
)
# Tables loaded from exports have no stream position: their documents are written once.
EXPORT_SYNC_COLUMNS = tuple(column for column in SYNC_COLUMNS if column[0] != SEQUENCE_COLUMN)
SOURCES = {"stream": SYNC_COLUMNS, "export": EXPORT_SYNC_COLUMNS}
# Stream sequence numbers are decimal strings of up to 40 digits; left-padding makes them sort as text.
SEQUENCE_DIGITS = 40
# Fractional digits a decimal attribute is compared at to tell whether the column would round it.
EXACTNESS_SCALE = 18


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    attribute: str
    transform: str = "string"
    precision: int = 38
    scale: int = 0
    required: bool = False

    def __post_init__(self):
        validate_identifier(self.name, "column name")
        # Attribute names are free text in DynamoDB; the ones we type must also be safe in SQL.
        validate_identifier(self.attribute, "attribute name")
        if self.transform not in TRANSFORMS:
            raise ValueError(f"column {self.name}: unknown transform {self.transform!r}; known: {sorted(TRANSFORMS)}")
        if not (1 <= self.precision <= 38 and 0 <= self.scale <= self.precision):
            raise ValueError(f"column {self.name}: decimal({self.precision},{self.scale}) is not valid")

    @property
    def type_tag(self) -> str:
        return TRANSFORMS[self.transform][0]

    @property
    def sql_type(self) -> str:
        if self.transform == "decimal":
            return f"decimal({self.precision},{self.scale})"
        return TRANSFORMS[self.transform][1]


@dataclass(frozen=True)
class TableSpec:
    table: str
    key: ColumnSpec
    columns: tuple[ColumnSpec, ...]
    partition_by: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = field(default=())
    source: str = "stream"

    def __post_init__(self):
        validate_identifier(self.table, "table name")
        if self.source not in SOURCES:
            raise ValueError(f"table {self.table}: source {self.source!r} is not one of {sorted(SOURCES)}")
        if self.key.transform != "string":
            raise ValueError("the key column must be a string (S) attribute")
        names = [column.name for column in self.all_columns]
        reserved = {name for name, _, _ in SYNC_COLUMNS}
        duplicates = {name for name in names if names.count(name) > 1} | (set(names) & reserved)
        if duplicates:
            raise ValueError(f"table {self.table}: duplicate or reserved column names {sorted(duplicates)}")
        for transform in self.partition_by:
            _, column = _partition_parts(transform)
            if column not in names:
                raise InvalidIdentifierError(f"partition column {column!r} is not a column of {self.table}")

    @property
    def all_columns(self) -> tuple[ColumnSpec, ...]:
        return (self.key, *self.columns)

    @property
    def sync_columns(self) -> tuple[tuple[str, str, str], ...]:
        """(name, type, comment) of the columns this table carries besides the typed ones."""
        return SOURCES[self.source]

    @property
    def table_column_names(self) -> list[str]:
        """Every column of the Iceberg table, in table order."""
        return [column.name for column in self.all_columns] + [name for name, _, _ in self.sync_columns]

    @property
    def partition_column(self) -> ColumnSpec | None:
        """The column the table is partitioned by (the first partition field), if any."""
        if not self.partition_by:
            return None
        _, name = _partition_parts(self.partition_by[0])
        return next(column for column in self.all_columns if column.name == name)


_PARTITION_TRANSFORMS = ("years", "months", "days", "hours")


def _partition_parts(transform: str) -> tuple[str | None, str]:
    """(transform function or None, column) of `days(created_at)` or `created_at`, both validated."""
    if "(" not in transform:
        return None, validate_identifier(transform, "partition column")
    function, _, rest = transform.partition("(")
    if function not in _PARTITION_TRANSFORMS or not rest.endswith(")"):
        raise InvalidIdentifierError(f"partition transform {transform!r}: use one of {_PARTITION_TRANSFORMS}")
    return function, validate_identifier(rest[:-1], "partition column")


def _partition_sql(transform: str) -> str:
    function, column = _partition_parts(transform)
    return f"{function}({column})" if function else column


def timestamp_literal(moment: datetime) -> str:
    """A Spark SQL timestamp literal of `moment`, in UTC (the session time zone)."""
    return moment.astimezone(UTC).strftime("TIMESTAMP '%Y-%m-%d %H:%M:%S.%f'")


def image_schema_ddl(spec: TableSpec) -> str:
    """Spark DDL for from_json over an image: only the typed attributes, each with its type tag.

    Spark keeps a nested JSON value whose schema says `string` as its raw JSON text, which is how
    lists and maps become JSON columns.
    """
    fields = [f"`{column.attribute}`: struct<`{column.type_tag}`: string>" for column in spec.all_columns]
    return f"struct<{', '.join(fields)}>"


def raw_value_sql(column: ColumnSpec, image: str = "image") -> str:
    return f"{validate_identifier(image)}.`{column.attribute}`.`{column.type_tag}`"


def typed_value_sql(column: ColumnSpec, image: str = "image") -> str:
    """The Spark SQL expression that turns the raw tagged value into the column's type (NULL if it cannot)."""
    raw = raw_value_sql(column, image)
    if column.transform in ("string", "json_list", "json_map"):
        return raw
    if column.transform == "decimal":
        return f"try_cast({raw} AS {column.sql_type})"
    if column.transform == "epoch_nanos_timestamp":
        # Iceberg timestamps are microseconds: nanoseconds are truncated, the exact value stays in `item`.
        return f"timestamp_micros(CAST(floor(try_cast({raw} AS decimal(38,0)) / 1000) AS bigint))"
    if column.transform == "iso_timestamp":
        return f"try_cast({raw} AS timestamp)"
    if column.transform == "boolean":
        return f"try_cast({raw} AS boolean)"
    raise AssertionError(column.transform)


def typed_columns_sql(columns: Iterable[ColumnSpec], image: str = "image") -> list[str]:
    return [f"{typed_value_sql(column, image)} AS {column.name}" for column in columns]


def image_problem_sql(spec: TableSpec, image: str = "image") -> str:
    """A SQL expression giving the first reason an image cannot be loaded, or NULL when it can."""
    cases = []
    for column in spec.all_columns:
        raw = raw_value_sql(column, image)
        if column.required or column is spec.key:
            cases.append(f"WHEN {raw} IS NULL THEN 'missing required attribute {column.attribute} ({column.type_tag})'")
        if column.transform not in ("string", "json_list", "json_map"):
            cases.append(
                f"WHEN {raw} IS NOT NULL AND {typed_value_sql(column, image)} IS NULL THEN 'attribute {column.attribute} is not a valid {column.sql_type}'"
            )
        if column.transform == "decimal":
            # A cast rounds to the column's scale; a value that would lose digits is refused, not rounded.
            cases.append(
                f"WHEN {typed_value_sql(column, image)} <> try_cast({raw} AS decimal(38,{EXACTNESS_SCALE})) "
                f"THEN 'attribute {column.attribute} has more digits than {column.sql_type} keeps'"
            )
    return f"CASE {' '.join(cases)} ELSE NULL END" if cases else "CAST(NULL AS string)"


def create_table_sql(spec: TableSpec, catalog_table: str) -> str:
    columns = [f"{column.name} {column.sql_type}" for column in spec.all_columns]
    columns += [f"{name} {sql_type} COMMENT '{comment}'" for name, sql_type, comment in spec.sync_columns]
    properties = {
        "format-version": "2",
        # Minute-sized merges: write delete files instead of rewriting data files; compaction tidies up.
        "write.merge.mode": "merge-on-read",
        "write.update.mode": "merge-on-read",
        "write.delete.mode": "merge-on-read",
        **dict(spec.properties),
    }
    partitioned = f" PARTITIONED BY ({', '.join(_partition_sql(p) for p in spec.partition_by)})" if spec.partition_by else ""
    return (
        f"CREATE TABLE IF NOT EXISTS {dotted_name(catalog_table)} ({', '.join(columns)}) "
        f"USING iceberg{partitioned} TBLPROPERTIES ({properties_sql(properties)})"
    )


def set_properties_sql(catalog_table: str, properties: Mapping[str, str]) -> str:
    return f"ALTER TABLE {dotted_name(catalog_table)} SET TBLPROPERTIES ({properties_sql(properties)})"


def properties_sql(properties: Mapping[str, str]) -> str:
    """`'key'='value', ...`; a quote or backslash in a key or value is refused rather than escaped."""
    for text in (*properties.keys(), *properties.values()):
        if not isinstance(text, str) or "'" in text or "\\" in text:
            raise ValueError(f"table property text {text!r} is not allowed: no quotes or backslashes")
    return ", ".join(f"'{key}'='{value}'" for key, value in properties.items())


def upsert_merge_sql(spec: TableSpec, catalog_table: str, source_view: str) -> str:
    """MERGE applying the latest change per key: newer changes win, REMOVE deletes, never the reverse."""
    key = spec.key.name
    columns = spec.table_column_names
    newer = f"t.{SEQUENCE_COLUMN} < s.{SEQUENCE_COLUMN}"
    return (
        f"MERGE INTO {dotted_name(catalog_table)} t "
        f"USING {validate_identifier(source_view)} s ON t.{key} = s.{key} "
        f"WHEN MATCHED AND s.event_name = 'REMOVE' AND {newer} THEN DELETE "
        f"WHEN MATCHED AND s.event_name <> 'REMOVE' AND {newer} THEN UPDATE SET "
        + ", ".join(f"t.{name} = s.{name}" for name in columns)
        + f" WHEN NOT MATCHED AND s.event_name <> 'REMOVE' THEN INSERT ({', '.join(columns)}) "
        f"VALUES ({', '.join('s.' + name for name in columns)})"
    )


def insert_only_merge_sql(spec: TableSpec, catalog_table: str, source_view: str) -> str:
    """MERGE inserting the documents whose key is not in the table; an existing row is never rewritten.

    The partition column is part of the match (documents are immutable, so it is equal whenever the
    key is), which lets Iceberg read only the partitions the batch touches.
    """
    key = spec.key.name
    columns = spec.table_column_names
    match = f"t.{key} = s.{key}"
    if spec.partition_column is not None and spec.partition_column is not spec.key:
        match += f" AND t.{spec.partition_column.name} = s.{spec.partition_column.name}"
    return (
        f"MERGE INTO {dotted_name(catalog_table)} t USING {validate_identifier(source_view)} s ON {match} "
        f"WHEN NOT MATCHED THEN INSERT ({', '.join(columns)}) VALUES ({', '.join('s.' + name for name in columns)})"
    )


# Every commit writes a new metadata.json; without these each one stays forever (a commit every few seconds).
# Every commit also writes a manifest, and every query reads them all: by default they are merged only once 100
# pile up, so a 10-s sync cycle read up to ~180 between compactions. Merging at 2 keeps one small data and one
# delete manifest, rewritten at each commit (docs/performance-log.md, "CPU of a sync cycle").
METADATA_UPKEEP_PROPERTIES = (
    ("write.metadata.delete-after-commit.enabled", "true"),
    ("write.metadata.previous-versions-max", "20"),
    ("commit.manifest.min-count-to-merge", "2"),
)

BOOKS_SPEC = TableSpec(
    table="books",
    key=ColumnSpec("id", "id", "string", required=True),
    columns=(
        ColumnSpec("name", "name"),
        ColumnSpec("author", "author"),
        ColumnSpec("summary", "summary"),
        ColumnSpec("published_at", "date", "epoch_nanos_timestamp"),
    ),
    properties=(
        *METADATA_UPKEEP_PROPERTIES,
        # One position-delete file a commit, not one for each data file a MERGE touches: between compactions every
        # commit touched all the files the previous ones added, so a 10-s cycle wrote up to 12 delete files
        # (`make bench-requests`); the one file's few thousand positions cost a reader nothing to skip.
        ("write.delete.granularity", "partition"),
    ),
)


ORDERS_SPEC = TableSpec(
    table="orders",
    key=ColumnSpec("order_id", "order_id", "string", required=True),
    columns=(
        ColumnSpec("customer_id", "customer_id"),
        ColumnSpec("amount", "amount", "decimal", precision=18, scale=2),
        ColumnSpec("currency", "currency"),
        # Required: it is the partition column, and part of the match condition of the load.
        ColumnSpec("created_at", "created_at", "iso_timestamp", required=True),
        ColumnSpec("items", "items", "json_list"),
        ColumnSpec("paid", "paid", "boolean"),
    ),
    # Athena prunes by day; each day of orders is one partition.
    partition_by=("days(created_at)",),
    properties=(
        # Ids and the item JSON never fit a dictionary, yet Parquet builds one per row group up to
        # this size before falling back; 64 KB still holds the dictionaries of columns like currency.
        ("write.parquet.dict-size-bytes", "65536"),
        # Level 1 writes files as small as the default level 3 for this data, in less time.
        ("write.parquet.compression-level", "1"),
        *METADATA_UPKEEP_PROPERTIES,
    ),
    source="export",
)
