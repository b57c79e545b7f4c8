"""The tables ddb_athena keeps, as declared in ddb_athena/tables.toml: read and validated here, once, with errors that
name the table and the field. No Dagster and nothing beyond the standard library and the table specs, so the code
location, the CLI, the capture Lambda, the EMR job and the tests of the templates read the same declarations.
"""

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from ddb_athena.lake.identifiers import validate_identifier
from ddb_athena.lake.table_spec import KEY_TRANSFORMS, SOURCE_PROPERTIES, TRANSFORMS, ColumnSpec, TableSpec, tombstone_table

DECLARATIONS_FILE = Path(__file__).resolve().parents[1] / "tables.toml"
# A sync run's cycle interval (lib/settings.py has the default): above a minute the promise of a minute or two, and the
# 2-minute backlog check, no longer hold.
MIN_MERGE_INTERVAL_SECONDS, MAX_MERGE_INTERVAL_SECONDS = 1.0, 60.0
# A table's own interval may be longer, up to Firehose's longest buffering interval, and at most a part of its own
# freshness bound: its freshness check holds through an interval, its cycle and one cycle missed.
MAX_TABLE_MERGE_INTERVAL_SECONDS = 900.0
FRESHNESS_INTERVALS = 2
# A kind of table -> (its TableSpec source, the suffixes of its two assets and of its S3 prefix).
KINDS = {"streamed": "stream", "exported": "export"}
# Who reads a streamed table's stream: the sync run itself, or the data stack's capture Lambda (its event source
# mapping exists for the tables that say lambda, deploy/ddb_athena.yaml.j2).
CAPTURES = ("run", "lambda")
# Where an exported table's Spark load runs: the run's own session, a spark-submit job beside it, EMR Serverless.
LOAD_MODES = ("in_process", "spark_submit", "emr_serverless")
_ASSET_SUFFIXES = {"streamed": ("source", "iceberg"), "exported": ("export", "athena")}
_FIELDS = {
    "kind": "streamed or exported",
    "dynamodb_table": "the DynamoDB table's name",
    "dynamodb_table_variable": "an environment variable that overrides dynamodb_table",
    "iceberg_table": "the Iceberg table's name in the namespace",
    "partition_key": "{ attribute, type = S | N | B }",
    "sort_key": "{ attribute, type = S | N | B }",
    "columns": "a list of { name, attribute, transform, precision, scale, required }",
    "partition_by": 'a list like ["days(created_at)"]',
    "freshness_minutes": "minutes without an update before the freshness check turns red",
    "snapshot_retention_hours": "hours of snapshots kept for readers (at least 1); default the sync resource's",
    "merge_interval_seconds": f"a streamed table's own sync interval ({MIN_MERGE_INTERVAL_SECONDS:g}-{MAX_TABLE_MERGE_INTERVAL_SECONDS:g} s, at most "
    f"1/{FRESHNESS_INTERVALS} of its freshness_minutes); default the run's",
    "capture": f"a streamed table's stream reader: {' or '.join(CAPTURES)}; default the stack's (DDB_ATHENA_BOOKS_CAPTURE)",
    "start_date": "an exported table's first daily partition, a date like 2026-11-01",
    "schedule_hour": "the hour (UTC, 0-23) an exported table's daily schedule loads the day that ended",
    "load": f"where an exported table's Spark load runs: {', '.join(LOAD_MODES)}",
}
# The fields of one kind of table only.
_KIND_FIELDS = {"streamed": ("merge_interval_seconds", "capture"), "exported": ("start_date", "schedule_hour", "load")}
_REQUIRED = ("kind", "dynamodb_table", "iceberg_table", "partition_key", "freshness_minutes")
_KEY_FIELDS = ("attribute", "type", "name", "precision", "scale")
_COLUMN_FIELDS = ("name", "attribute", "transform", "precision", "scale", "required")
# DynamoDB's rule for table names; they never reach SQL.
_DYNAMODB_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}")
_VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]*")
# Glue keeps table and column names in lower case (and Athena reads them so): a name that is not would be another
# name there, or two names one.
_GLUE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,127}")


class DeclarationError(ValueError):
    """A table declaration that cannot work; the message names the table and the field."""


@dataclass(frozen=True)
class TableDeclaration:
    name: str
    kind: str
    dynamodb_table: str
    dynamodb_table_variable: str | None
    spec: TableSpec
    freshness: timedelta
    snapshot_retention_hours: float | None = None
    merge_interval_seconds: float | None = None
    # Unset: the deployment's (lib/settings.py; an exported table's DDB_ATHENA_<NAME>_* variables override these).
    capture: str | None = None
    start_date: date | None = None
    schedule_hour: int | None = None
    load: str | None = None

    @property
    def iceberg_table(self) -> str:
        return self.spec.table

    @property
    def source_asset(self) -> str:
        """The asset of the table's DynamoDB side (books_source, orders_export), also its S3 prefix."""
        return f"{self.name}_{_ASSET_SUFFIXES[self.kind][0]}"

    @property
    def table_asset(self) -> str:
        """The asset of the Iceberg table Athena reads (books_iceberg, orders_athena)."""
        return f"{self.name}_{_ASSET_SUFFIXES[self.kind][1]}"

    @property
    def source_prefix(self) -> str:
        return self.source_asset

    @property
    def cleanup_job(self) -> str:
        """The job that deletes the source files the table's commits consumed (its task takes the cleanups' role on ECS)."""
        return f"{self.source_asset}_cleanup"

    @property
    def writer_pool(self) -> str:
        """The Dagster pool of every run that writes the table but the sync (limited to one run at a time)."""
        return f"{self.name}_writer"

    @property
    def upkeep_pool(self) -> str:
        """The Dagster pool of the table's upkeep runs (expiry, orphans: no writer), one at a time, beside its writers."""
        return f"{self.name}_upkeep"

    def dynamodb_table_name(self, environ: Mapping[str, str]) -> str:
        """The DynamoDB table's name: its variable's value where the environment sets it, else the declared name."""
        name = environ.get(self.dynamodb_table_variable) if self.dynamodb_table_variable else None
        return name or self.dynamodb_table


def _fail(table: str, field: str, problem: str) -> DeclarationError:
    return DeclarationError(f"{DECLARATIONS_FILE.name}: table {table}, field {field}: {problem}")


def _unknown_fields(table: str, where: str, entry: Mapping[str, Any], known) -> None:
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise _fail(table, where, f"unknown field {unknown[0]!r}; a {where} may say {', '.join(known)}")


def _typed(table: str, field: str, value: Any, kind: type, meaning: str) -> Any:
    # bool is an int in Python; a number field given true is refused.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _fail(table, field, f"expected {meaning}, got {value!r}")
    return value


def _glue_name(table: str, field: str, value: Any, what: str) -> str:
    _typed(table, field, value, str, what)
    if not _GLUE_NAME.fullmatch(value):
        raise _fail(table, field, f"{value!r} is not a name Glue keeps as written: lower-case letters, digits and _, starting with a letter or _")
    return value


def _one_of(table: str, field: str, value: Any, choices: tuple[str, ...]) -> str | None:
    if value is not None and value not in choices:
        raise _fail(table, field, f"{value!r} is not one of {', '.join(choices)}")
    return value


def _column_spec(table: str, field: str, entry: Mapping[str, Any], transform: str, required: Any) -> ColumnSpec:
    """A key's or a column's ColumnSpec, every field of the right type (TOML's true is no precision, "10" no number)."""
    attribute = _typed(table, f"{field}.attribute", entry["attribute"], str, "an attribute name")
    if "name" not in entry and not _GLUE_NAME.fullmatch(attribute):
        raise _fail(table, field, f"its column is named after its attribute, and {attribute!r} is no name Glue keeps as written: give it a name")
    name = _glue_name(table, f"{field}.name", entry.get("name", attribute), "a column name")
    try:
        return ColumnSpec(
            name=name,
            attribute=attribute,
            transform=transform,
            precision=_typed(table, f"{field}.precision", entry.get("precision", 38), int, "a whole number of digits, 1 to 38"),
            scale=_typed(table, f"{field}.scale", entry.get("scale", 0), int, "a whole number of fractional digits"),
            required=_typed(table, f"{field}.required", required, bool, "true or false"),
        )
    except ValueError as error:
        raise _fail(table, field, str(error)) from None


def _key_column(table: str, field: str, entry: Any) -> ColumnSpec:
    _typed(table, field, entry, dict, 'a table like { attribute = "id", type = "S" }')
    _unknown_fields(table, field, entry, _KEY_FIELDS)
    if "attribute" not in entry or "type" not in entry:
        raise _fail(table, field, "needs an attribute and a type (S, N or B)")
    key_type = entry["type"]
    if key_type not in KEY_TRANSFORMS:
        raise _fail(table, f"{field}.type", f"{key_type!r} is not a key type of DynamoDB: S, N or B")
    return _column_spec(table, field, entry, KEY_TRANSFORMS[key_type], required=True)


def _column(table: str, index: int, entry: Any) -> ColumnSpec:
    field = f"columns[{index}]"
    _typed(table, field, entry, dict, 'a table like { name = "title", attribute = "title" }')
    _unknown_fields(table, field, entry, _COLUMN_FIELDS)
    if "name" not in entry or "attribute" not in entry:
        raise _fail(table, field, "needs a name and an attribute")
    transform = entry.get("transform", "string")
    if transform not in TRANSFORMS:
        raise _fail(table, f"{field}.transform", f"{transform!r} is not one of {', '.join(TRANSFORMS)}")
    return _column_spec(table, field, entry, transform, required=entry.get("required", False))


def _one_column_an_attribute(table: str, columns: Mapping[str, ColumnSpec]) -> None:
    """Each attribute read by one column (the key's included): Spark reads the image's attributes as a struct's fields,
    case-insensitively, and refuses a field named twice (AMBIGUOUS_REFERENCE_TO_FIELDS) at every merge."""
    readers: dict[str, str] = {}
    for field, column in columns.items():
        other = readers.setdefault(column.attribute.casefold(), field)
        if other != field:
            raise _fail(table, field, f"attribute {column.attribute!r} is read by {other} already: one column an attribute (names equal but for case are one)")


def declaration(name: str, entry: Any) -> TableDeclaration:
    """One table's declaration, validated."""
    try:
        validate_identifier(name, "table name")
    except ValueError as error:
        raise _fail(name, "[name]", str(error)) from None
    _typed(name, "[name]", entry, dict, "a table of fields")
    _unknown_fields(name, "table", entry, _FIELDS)
    for field in _REQUIRED:
        if field not in entry:
            raise _fail(name, field, f"missing: {_FIELDS[field]}")
    kind = entry["kind"]
    if kind not in KINDS:
        raise _fail(name, "kind", f"{kind!r} is not one of {', '.join(KINDS)}")
    dynamodb_table = _typed(name, "dynamodb_table", entry["dynamodb_table"], str, "a DynamoDB table name")
    if not _DYNAMODB_TABLE.fullmatch(dynamodb_table):
        raise _fail(name, "dynamodb_table", f"{dynamodb_table!r} is not a DynamoDB table name (3-255 letters, digits, _ . -)")
    variable = entry.get("dynamodb_table_variable")
    if variable is not None and not (isinstance(variable, str) and _VARIABLE.fullmatch(variable)):
        raise _fail(name, "dynamodb_table_variable", f"{variable!r} is not an environment variable name (capitals, digits, _)")
    iceberg_table = _glue_name(name, "iceberg_table", entry["iceberg_table"], "an Iceberg table name")
    columns = _typed(name, "columns", entry.get("columns", []), list, "a list of columns")
    partition_by = _typed(name, "partition_by", entry.get("partition_by", []), list, "a list of partition transforms")
    for index, transform in enumerate(partition_by):
        _typed(name, f"partition_by[{index}]", transform, str, 'a partition transform like "days(created_at)"')
    freshness = _typed(name, "freshness_minutes", entry["freshness_minutes"], int | float, "a number of minutes")
    if isinstance(freshness, bool) or freshness <= 0:
        raise _fail(name, "freshness_minutes", f"expected a positive number of minutes, got {freshness!r}")
    retention = entry.get("snapshot_retention_hours")
    # At least an hour, as the sync resource's: longer than the longest query, whose files an expiry would delete.
    if retention is not None and (isinstance(retention, bool) or not isinstance(retention, int | float) or retention < 1):
        raise _fail(name, "snapshot_retention_hours", f"expected a number of hours, at least 1 (longer than the longest query), got {retention!r}")
    for other_kind, fields in _KIND_FIELDS.items():
        for field in fields:
            if other_kind != kind and field in entry:
                raise _fail(name, field, f"only a {other_kind} table has one ({_FIELDS[field]}); {name} is {kind}")
    interval = entry.get("merge_interval_seconds")
    if interval is not None:
        bounds = MIN_MERGE_INTERVAL_SECONDS, MAX_TABLE_MERGE_INTERVAL_SECONDS
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not bounds[0] <= interval <= bounds[1]:
            raise _fail(name, "merge_interval_seconds", f"expected seconds from {bounds[0]:g} to {bounds[1]:g}, got {interval!r}")
        if interval * FRESHNESS_INTERVALS > freshness * 60:
            raise _fail(
                name,
                "merge_interval_seconds",
                f"{interval:g} s is more than 1/{FRESHNESS_INTERVALS} of freshness_minutes ({freshness:g}): its freshness check would turn red "
                f"between two merges; raise freshness_minutes to {interval * FRESHNESS_INTERVALS / 60:g} or more, or merge more often",
            )
    capture = _one_of(name, "capture", entry.get("capture"), CAPTURES)
    load = _one_of(name, "load", entry.get("load"), LOAD_MODES)
    start_date = entry.get("start_date")
    if isinstance(start_date, str):
        try:
            start_date = date.fromisoformat(start_date)
        except ValueError:
            raise _fail(name, "start_date", f"expected a date like 2026-11-01, got {start_date!r}") from None
    # TOML's own date (start_date = 2026-11-01) is a date; its date-time is one too in Python, and no partition's start.
    if start_date is not None and (type(start_date) is not date):
        raise _fail(name, "start_date", f"expected a date like 2026-11-01, got {start_date!r}")
    hour = entry.get("schedule_hour")
    if hour is not None and (_typed(name, "schedule_hour", hour, int, "an hour of the day, 0 to 23 (UTC)") not in range(24)):
        raise _fail(name, "schedule_hour", f"expected an hour of the day, 0 to 23 (UTC), got {hour!r}")
    key = _key_column(name, "partition_key", entry["partition_key"])
    sort_key = _key_column(name, "sort_key", entry["sort_key"]) if "sort_key" in entry else None
    typed_columns = tuple(_column(name, index, column) for index, column in enumerate(columns))
    keys = {"partition_key": key} | ({"sort_key": sort_key} if sort_key else {})
    _one_column_an_attribute(name, keys | {f"columns[{index}]": column for index, column in enumerate(typed_columns)})
    source = KINDS[kind]
    try:
        spec = TableSpec(
            table=iceberg_table,
            key=key,
            sort_key=sort_key,
            columns=typed_columns,
            partition_by=tuple(partition_by),
            properties=SOURCE_PROPERTIES[source],
            source=source,
        )
    except ValueError as error:
        raise _fail(name, "iceberg_table, columns or partition_by", str(error)) from None
    if kind == "exported" and (spec.partition_column is None or spec.partition_column.sql_type != "timestamp"):
        raise _fail(name, "partition_by", "an exported table needs a timestamp partition column (its load matches on it), e.g. days(created_at)")
    if kind == "exported" and not spec.partition_column.required and spec.partition_column not in spec.key_columns:
        # The load's insert-only match compares it: a document without it would load with a NULL partition, never
        # match, and load again at every load (a second row for the key).
        field = f"columns[{typed_columns.index(spec.partition_column)}].required"
        raise _fail(name, field, f"the partition column {spec.partition_column.name} of an exported table must be required = true (its load matches on it)")
    return TableDeclaration(name, kind, dynamodb_table, variable, spec, timedelta(minutes=freshness), retention, interval, capture, start_date, hour, load)


def parse_declarations(text: str) -> dict[str, TableDeclaration]:
    """Every table of a declarations file's text, validated, and checked against each other."""
    try:
        entries = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise DeclarationError(f"{DECLARATIONS_FILE.name}: not valid TOML: {error}") from None
    tables = {name: declaration(name, entry) for name, entry in entries.items()}
    if not tables:
        raise DeclarationError(f"{DECLARATIONS_FILE.name}: no table declared")
    iceberg_names = {}
    for table in tables.values():
        # A table's tombstones are <iceberg_table>_tombstones beside it: no declared table may take that name.
        for name in (table.iceberg_table, tombstone_table(table.iceberg_table)):
            if name in iceberg_names:
                other = iceberg_names[name]
                raise _fail(table.name, "iceberg_table", f"{table.iceberg_table!r} collides with table {other}'s {name!r}")
        iceberg_names[table.iceberg_table] = table.name
        if table.kind == "streamed":
            iceberg_names[tombstone_table(table.iceberg_table)] = table.name
    return tables


@cache
def declared_tables() -> dict[str, TableDeclaration]:
    """The tables of ddb_athena/tables.toml, read once per process."""
    return parse_declarations(DECLARATIONS_FILE.read_text(encoding="utf-8"))


class UndeclaredStreamError(LookupError):
    """A DynamoDB stream of a table no streamed declaration names."""


def streamed_table_of(stream_arn: str, environ: Mapping[str, str]) -> TableDeclaration:
    """The streamed table whose DynamoDB table owns the stream `stream_arn`
    (`arn:aws:dynamodb:<region>:<account>:table/<name>/stream/<label>`): by its declared name, or the one its variable
    gives in `environ`."""
    name = stream_arn.split(":table/", 1)[-1].split("/stream/", 1)[0]
    for table in declared_tables().values():
        if table.kind == "streamed" and table.dynamodb_table_name(environ) == name:
            return table
    raise UndeclaredStreamError(f"no streamed table in {DECLARATIONS_FILE.name} is the DynamoDB table {name!r} (is its dynamodb_table_variable set?)")


def declared(name: str) -> TableDeclaration:
    tables = declared_tables()
    if name not in tables:
        raise DeclarationError(f"{DECLARATIONS_FILE.name}: no table {name!r} is declared (declared: {', '.join(tables)})")
    return tables[name]
