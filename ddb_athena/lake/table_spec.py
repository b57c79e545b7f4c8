"""Table specs: which DynamoDB attributes become which typed Iceberg columns, and the SQL for them.

Everything that depends on a table's shape is generated here from a spec, so that another
table is one spec away. Every name is validated before it reaches SQL.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ddb_athena.lake.identifiers import InvalidIdentifierError, dotted_name, quoted_identifier, string_literal, validate_identifier

# transform -> (DynamoDB type tag it reads, Iceberg/Spark SQL type or None when it takes a parameter)
TRANSFORMS = {
    "string": ("S", "string"),
    "decimal": ("N", None),
    "epoch_nanos_timestamp": ("N", "timestamp"),
    "iso_timestamp": ("S", "timestamp"),
    "boolean": ("BOOL", "boolean"),
    "json_list": ("L", "string"),
    "json_map": ("M", "string"),
    "binary": ("B", "binary"),
}
# A key attribute's DynamoDB type -> the transform of its column: compared exactly (table_keys.py).
KEY_TRANSFORMS = {"S": "string", "N": "decimal", "B": "binary"}

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
# Names the merge and the load give their own columns beside the table's (and the tombstones' column): a declared
# column may not take one.
INTERNAL_COLUMNS = frozenset(
    {"source_file", "file_name", "line", "event_name", "keys", "key_values", "new_image", "sequence_number", "approximate_creation_time"}
    | {"image", "image_json", "envelope", "envelope_problem", "reason", "kind", "full_item", "metadata", "deleted_at", "content", "path"}
)
# Stream sequence numbers are decimal strings of up to 40 digits; left-padding makes them sort as text.
SEQUENCE_DIGITS = 40


# DynamoDB's limit for a key attribute's name; a typed column's is held to it too.
MAX_ATTRIBUTE_NAME_BYTES = 255


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
        # Attribute names are free text in DynamoDB (dashes, dots, spaces, any UTF-8): they reach SQL only quoted
        # (quoted_identifier) or as text (string_literal), never bare.
        if not isinstance(self.attribute, str) or not 1 <= len(self.attribute.encode("utf-8")) <= MAX_ATTRIBUTE_NAME_BYTES:
            limit = MAX_ATTRIBUTE_NAME_BYTES
            raise ValueError(f"column {self.name}: attribute name {self.attribute!r} must be 1 to {limit} bytes of UTF-8, as DynamoDB's key attributes")
        if self.transform not in TRANSFORMS:
            raise ValueError(f"column {self.name}: unknown transform {self.transform!r}; known: {sorted(TRANSFORMS)}")
        if not (1 <= self.precision <= 38 and 0 <= self.scale <= self.precision):
            raise ValueError(f"column {self.name}: decimal({self.precision},{self.scale}) is not valid")

    @property
    def derivation(self) -> list[str]:
        """What the column's values are made from: its attribute and transform (the SQL type is the schema's)."""
        return [self.attribute, self.transform]

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
    """A table's shape: its key (a partition key and an optional sort key, as in DynamoDB), typed columns, partitioning
    and properties. The key's canonical form, in SQL and in Python, is table_keys.py's."""

    table: str
    key: ColumnSpec
    columns: tuple[ColumnSpec, ...]
    partition_by: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = field(default=())
    source: str = "stream"
    sort_key: ColumnSpec | None = None

    def __post_init__(self):
        validate_identifier(self.table, "table name")
        if self.source not in SOURCES:
            raise ValueError(f"table {self.table}: source {self.source!r} is not one of {sorted(SOURCES)}")
        for role, column in zip(("partition key", "sort key"), self.key_columns, strict=False):
            if column.transform not in KEY_TRANSFORMS.values():
                raise ValueError(
                    f"table {self.table}: the {role} {column.attribute!r} must be S, N or B (transform string, decimal or binary), not {column.transform}"
                )
        names = [column.name for column in self.all_columns]
        reserved = {name for name, _, _ in SYNC_COLUMNS} | INTERNAL_COLUMNS
        duplicates = {name for name in names if names.count(name) > 1} | (set(names) & reserved) | {name for name in names if name.startswith("_")}
        if duplicates:
            raise ValueError(
                f"table {self.table}: duplicate or reserved column names {sorted(duplicates)} (reserved: names starting with _, {sorted(reserved)})"
            )
        for transform in self.partition_by:
            _, column = _partition_parts(transform)
            if column not in names:
                raise InvalidIdentifierError(f"partition column {column!r} is not a column of {self.table}")

    @property
    def key_columns(self) -> tuple[ColumnSpec, ...]:
        """The partition key's column, then the sort key's, if any: together they name one item."""
        return (self.key,) if self.sort_key is None else (self.key, self.sort_key)

    @property
    def key_names(self) -> list[str]:
        return [column.name for column in self.key_columns]

    @property
    def all_columns(self) -> tuple[ColumnSpec, ...]:
        return (*self.key_columns, *self.columns)

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


def tombstone_table(target: str) -> str:
    """The table beside a streamed table that remembers its deletes (lake/change_merge.py)."""
    return f"{target}_tombstones"


def timestamp_literal(moment: datetime) -> str:
    """A Spark SQL timestamp literal of `moment`, in UTC (the session time zone)."""
    return moment.astimezone(UTC).strftime("TIMESTAMP '%Y-%m-%d %H:%M:%S.%f'")


def image_schema_ddl(spec: TableSpec) -> str:
    """Spark DDL for from_json over an image: only the typed attributes, each with its type tag.

    Spark keeps a nested JSON value whose schema says `string` as its raw JSON text, which is how
    lists and maps become JSON columns.
    """
    return attributes_schema_ddl(spec.all_columns)


def attributes_schema_ddl(columns: Iterable[ColumnSpec]) -> str:
    """Spark DDL for from_json over DynamoDB JSON holding these attributes (an image, or a record's Keys)."""
    fields = [f"{quoted_identifier(column.attribute)}: struct<`{column.type_tag}`: string>" for column in columns]
    return f"struct<{', '.join(fields)}>"


def raw_value_sql(column: ColumnSpec, image: str = "image") -> str:
    return f"{validate_identifier(image)}.{quoted_identifier(column.attribute)}.`{column.type_tag}`"


def typed_value_sql(column: ColumnSpec, image: str = "image") -> str:
    """The Spark SQL expression that turns the raw tagged value into the column's type (NULL if it cannot)."""
    raw = raw_value_sql(column, image)
    if column.transform in ("string", "json_list", "json_map"):
        return raw
    if column.transform == "decimal":
        # NULL, not rounded, when the column cannot hold the number exactly (a key must never move to another).
        return exact_decimal_value_sql(raw, column.precision, column.scale)
    if column.transform == "epoch_nanos_timestamp":
        # Iceberg timestamps are microseconds: nanoseconds are truncated, the exact value stays in `item`.
        return f"timestamp_micros(CAST(floor(try_cast({raw} AS decimal(38,0)) / 1000) AS bigint))"
    if column.transform == "iso_timestamp":
        return f"try_cast({raw} AS timestamp)"
    if column.transform == "boolean":
        return f"try_cast({raw} AS boolean)"
    if column.transform == "binary":
        # DynamoDB JSON carries B as base64.
        return f"try_to_binary({raw}, 'base64')"
    raise AssertionError(column.transform)


def type_mismatch_sql(columns: Iterable[ColumnSpec], image_json: str, image: str = "image") -> str:
    """A SQL expression naming the first typed attribute whose DynamoDB type is not its column's (`image_json`, the
    image's text, holds it under another tag; the column is NULL), with both types, never the value; NULL if none."""
    cases = []
    for column in columns:
        present_as = f"regexp_extract({_attribute_json_sql(column.attribute, image_json)}, '^[{{]\"([A-Z]+)\"', 1)"
        cases.append(
            f"WHEN {raw_value_sql(column, image)} IS NULL AND {present_as} NOT IN ('', 'NULL') "
            f"THEN concat({string_literal(f'attribute {column.attribute} is ')}, {present_as}, "
            f"{string_literal(f' where its column {column.name} expects {column.type_tag}')})"
        )
    return f"CASE {' '.join(cases)} END" if cases else "CAST(NULL AS string)"


def _attribute_json_sql(attribute: str, image_json: str) -> str:
    """The attribute's value in the image's text, as JSON: by a JSON path for a plain name (a streaming read), else from
    the image read as a map (a path cannot hold every name: a quote, a bracket), which parses the whole image."""
    if re.fullmatch(r"[A-Za-z0-9_]+", attribute):
        return f"get_json_object({validate_identifier(image_json)}, '$.{attribute}')"
    return f"element_at(from_json({validate_identifier(image_json)}, 'map<string,string>'), {string_literal(attribute)})"


def typed_columns_sql(columns: Iterable[ColumnSpec], image: str = "image") -> list[str]:
    return [f"{typed_value_sql(column, image)} AS {column.name}" for column in columns]


def image_problem_sql(spec: TableSpec, image: str = "image") -> str:
    """A SQL expression giving the first reason an image cannot be loaded, or NULL when it can."""
    cases = value_problem_cases(spec.all_columns, image, required=set(spec.key_columns), missing="missing required attribute")
    return f"CASE {' '.join(cases)} ELSE NULL END" if cases else "CAST(NULL AS string)"


def value_problem_cases(columns: Iterable[ColumnSpec], struct: str, required: set[ColumnSpec], missing: str) -> list[str]:
    """`WHEN ... THEN '<reason>'` clauses, one a problem, for the typed attributes of `struct` (an image or Keys); the
    reasons name the attribute and the types, never the value."""
    cases = []
    for column in columns:
        raw = raw_value_sql(column, struct)
        if column.required or column in required:
            cases.append(f"WHEN {raw} IS NULL THEN {string_literal(f'{missing} {column.attribute} ({column.type_tag})')}")
        if column.transform == "decimal":
            # A cast rounds to the column's scale; a value that would lose digits is refused, not rounded.
            cases.append(
                f"WHEN {_NumberSql(raw).rounded(column.precision, column.scale)} "
                f"THEN {string_literal(f'attribute {column.attribute} has more digits than {column.sql_type} keeps')}"
            )
        if column.transform not in ("string", "json_list", "json_map"):
            cases.append(
                f"WHEN {raw} IS NOT NULL AND {typed_value_sql(column, struct)} IS NULL "
                f"THEN {string_literal(f'attribute {column.attribute} is not a valid {column.sql_type}')}"
            )
    return cases


# A DynamoDB number as text, read alike by Python's `re` (fullmatch) and Java's regex (anchored, its length the
# text's): sign, integer digits, fraction digits, exponent (four digits at most: DynamoDB's numbers need three). A digit
# at least, in the integer or the fraction.
NUMBER_PATTERN = r"[+-]?([0-9]*)(?:[.]([0-9]*))?(?:[eE]([+-]?[0-9]{1,4}))?"


@dataclass(frozen=True)
class _NumberSql:
    """A DynamoDB number's text `raw` (SQL) read as its significant digits M (no leading or trailing zero) and the
    exponent e of its value M x 10^e, from the digits as text: never through a cast, which rounds first."""

    raw: str

    def _part(self, group: int) -> str:
        return f"regexp_extract({self.raw}, '^{NUMBER_PATTERN}', {group})"

    @property
    def _digits(self) -> str:
        return f"concat({self._part(1)}, {self._part(2)})"

    @property
    def _kept(self) -> str:  # the digits without trailing zeros
        return f"regexp_replace({self._digits}, '0+$', '')"

    @property
    def significant(self) -> str:
        return f"regexp_replace({self._kept}, '^0+', '')"

    @property
    def exponent(self) -> str:
        written = f"coalesce(try_cast(nullif({self._part(3)}, '') AS int), 0)"
        return f"({written} - length({self._part(2)}) + length({self._digits}) - length({self._kept}))"

    @property
    def valid(self) -> str:
        return f"(length({self._part(0)}) = length({self.raw}) AND length({self._digits}) > 0)"

    def _fits_integer(self, precision: int, scale: int) -> str:  # len(M) + e <= precision - scale, or a zero
        return f"({self.significant} = '' OR length({self.significant}) + {self.exponent} <= {int(precision) - int(scale)})"

    def _fits_fraction(self, scale: int) -> str:  # -e <= scale, or a zero
        return f"({self.significant} = '' OR -{self.exponent} <= {int(scale)})"

    def plain_fit(self, precision: int, scale: int) -> str:
        """The common case, told by one regular expression: plain notation, at most precision - scale integer digits
        and `scale` fraction digits (a cast keeps it whole). Anything else takes the reading by parts."""
        integer = f"[0-9]{{0,{int(precision) - int(scale)}}}"
        fraction = f"([.][0-9]{{0,{int(scale)}}})?" if scale else "[.]?"
        # \z, not $: Java's $ also matches before a final line break ("7\n" would pass, and a cast trims it).
        return f"({self.raw} RLIKE '^[+-]?{integer}{fraction}\\\\z' AND {self.raw} RLIKE '[0-9]')"

    def exact_by_parts(self, precision: int, scale: int) -> str:
        """Whether a decimal(precision, scale) holds the number without rounding, read by parts (any notation): its
        integer part needs at most precision - scale digits and its fraction at most `scale`."""
        return f"coalesce({self.valid} AND {self._fits_integer(precision, scale)} AND {self._fits_fraction(scale)}, false)"

    def rounded(self, precision: int, scale: int) -> str:
        """Whether it is a number the decimal would hold but for digits past `scale`: a cast would round it."""
        by_parts = f"{self.valid} AND {self._fits_integer(precision, scale)} AND NOT {self._fits_fraction(scale)}"
        return f"coalesce(NOT {self.plain_fit(precision, scale)} AND ({by_parts}), false)"

    @property
    def normalized(self) -> str:
        """The number as M E e (0 for a zero): what is cast once it is exact, whatever exponent it was written with."""
        sign = f"CASE WHEN {self.raw} LIKE '-%' THEN '-' ELSE '' END"
        return f"CASE WHEN {self.significant} = '' THEN '0' ELSE concat({sign}, {self.significant}, 'E', {self.exponent}) END"


def exact_decimal_value_sql(raw: str, precision: int, scale: int) -> str:
    """The DynamoDB number `raw` (SQL) as a decimal(precision, scale); NULL, never rounded, when it does not hold it, in
    plain or exponent notation. The same rule as table_keys.exact_number (a test holds them to the same verdicts)."""
    number, sql_type = _NumberSql(raw), f"decimal({int(precision)},{int(scale)})"
    return (
        f"CASE WHEN {number.plain_fit(precision, scale)} THEN CAST({raw} AS {sql_type}) "
        f"WHEN {number.exact_by_parts(precision, scale)} THEN CAST({number.normalized} AS {sql_type}) END"
    )


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
    """`'key'='value', ...`, any text escaped (a column's derivation holds its attribute's name)."""
    return ", ".join(f"{string_literal(key)}={string_literal(value)}" for key, value in properties.items())


def merge_sql(spec: TableSpec, catalog_table: str, source_view: str, insert_new: bool) -> str:
    """MERGE applying the latest change per key to the row of that key: newer changes win, REMOVE deletes, never the
    reverse. With `insert_new`, a key the table does not hold is inserted (an outer join, the changes on its preserved
    side: Spark sorts every key of the table into it); without, it is left to an append (an inner join, which Spark
    may broadcast the changes into)."""
    columns = spec.table_column_names
    newer = f"t.{SEQUENCE_COLUMN} < s.{SEQUENCE_COLUMN}"
    inserts = (
        f" WHEN NOT MATCHED AND s.event_name <> 'REMOVE' THEN INSERT ({', '.join(columns)}) VALUES ({', '.join('s.' + name for name in columns)})"
        if insert_new
        else ""
    )
    return (
        f"MERGE INTO {dotted_name(catalog_table)} t "
        f"USING {validate_identifier(source_view)} s ON {key_match_sql(spec, 't', 's')} "
        f"WHEN MATCHED AND s.event_name = 'REMOVE' AND {newer} THEN DELETE "
        f"WHEN MATCHED AND s.event_name <> 'REMOVE' AND {newer} THEN UPDATE SET " + ", ".join(f"t.{name} = s.{name}" for name in columns) + inserts
    )


def insert_only_merge_sql(spec: TableSpec, catalog_table: str, source_view: str) -> str:
    """MERGE inserting the documents whose key is not in the table; an existing row is never rewritten.

    The partition column is part of the match (documents are immutable, so it is equal whenever the
    key is), which lets Iceberg read only the partitions the batch touches.
    """
    columns = spec.table_column_names
    match = key_match_sql(spec, "t", "s")
    if spec.partition_column is not None and spec.partition_column not in spec.key_columns:
        match += f" AND t.{spec.partition_column.name} = s.{spec.partition_column.name}"
    return (
        f"MERGE INTO {dotted_name(catalog_table)} t USING {validate_identifier(source_view)} s ON {match} "
        f"WHEN NOT MATCHED THEN INSERT ({', '.join(columns)}) VALUES ({', '.join('s.' + name for name in columns)})"
    )


def key_match_sql(spec: TableSpec, left: str, right: str) -> str:
    """Whether rows `left` and `right` hold the same item: every key column equal, each compared as its type (text,
    an exact decimal, bytes), never through a joined string."""
    left, right = validate_identifier(left), validate_identifier(right)
    return " AND ".join(f"{left}.{name} = {right}.{name}" for name in spec.key_names)


# Every commit writes a new metadata.json; without these each one stays forever (a commit every few seconds).
# Every commit also writes a manifest, and every query reads them all: by default they are merged only once 100
# pile up, so a 10-s sync cycle read up to ~180 between compactions. Merging at 2 keeps one small data and one
# delete manifest, rewritten at each commit (docs/performance-log.md, "CPU of a sync cycle").
METADATA_UPKEEP_PROPERTIES = (
    ("write.metadata.delete-after-commit.enabled", "true"),
    ("write.metadata.previous-versions-max", "20"),
    ("commit.manifest.min-count-to-merge", "2"),
)

# What every writer of a streamed table and every compaction aims at per data file (Iceberg's default is 512 MB: too
# big for a small, busy table). A sync cycle rewrites a table's deleted rows out a few files at a time in what is left
# of its interval: ~7 s at 20 s within half a vCPU, where a whole-table pass went at ~15 MB/s (66 s a GB): a 64 MB file
# fits in it, a 128 MB one would not.
TARGET_FILE_BYTES = 64 * 1024 * 1024

# Exact bounds of the sequence number in each file (Iceberg keeps 16 characters by default, all zeros of the padding):
# a cycle's lookup of rows or deletes as new as its changes skips every file older than them.
SEQUENCE_BOUNDS_PROPERTY = (f"write.metadata.metrics.column.{SEQUENCE_COLUMN}", "full")

# The properties of every table of a kind (lib/declarations.py): "stream" tables merge every few seconds, "export"
# tables load a day of immutable documents at a time.
SOURCE_PROPERTIES = {
    "stream": (
        *METADATA_UPKEEP_PROPERTIES,
        SEQUENCE_BOUNDS_PROPERTY,
        # One position-delete file a commit, not one for each data file a MERGE touches: between compactions every
        # commit touched all the files the previous ones added, so a 10-s cycle wrote up to 12 delete files
        # (`make bench-requests`); the one file's few thousand positions cost a reader nothing to skip.
        ("write.delete.granularity", "partition"),
        ("write.target-file-size-bytes", str(TARGET_FILE_BYTES)),
    ),
    "export": (
        # Ids and the item JSON never fit a dictionary, yet Parquet builds one per row group up to
        # this size before falling back; 64 KB still holds the dictionaries of columns like currency.
        ("write.parquet.dict-size-bytes", "65536"),
        # Level 1 writes files as small as the default level 3 for this data, in less time.
        ("write.parquet.compression-level", "1"),
        *METADATA_UPKEEP_PROPERTIES,
    ),
}
