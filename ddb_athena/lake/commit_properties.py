"""Properties a commit carries in its snapshot's summary, and the newest of them as the table is published.

A sync cycle's stream positions are committed with its data (as Iceberg's own Kafka Connect and Flink sinks keep
their offsets): the positions move exactly when the changes they cover become visible, with no file of their own.
Iceberg's Spark writes (SQL MERGE included) add to their snapshot's summary the properties of
`org.apache.iceberg.spark.CommitMetadata`, which holds them for the thread that commits; its public setter takes a Java
`Callable`, so from Python the thread's value is set through its field, on the JVM thread that PySpark pins to this
Python thread (PySpark's default): the commit of a SQL statement runs on the thread that issued it.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from ddb_athena.lake.identifiers import dotted_name


def _commit_properties_of_this_thread(spark: SparkSession):
    holder = spark._jvm.org.apache.iceberg.spark.CommitMetadata._java_lang_class.getDeclaredField("COMMIT_PROPERTIES")
    holder.setAccessible(True)
    return holder.get(None)


@contextmanager
def committed_with(spark: SparkSession, properties: Mapping[str, str] | None) -> Iterator[None]:
    """Every Iceberg commit this thread makes in the block carries `properties` in its snapshot's summary."""
    if not properties:
        yield
        return
    local = _commit_properties_of_this_thread(spark)
    values = spark._jvm.java.util.HashMap()
    for name, value in properties.items():
        values.put(name, value)
    local.set(values)
    try:
        yield
    finally:
        local.remove()


def empty_commit(spark: SparkSession, table: str, properties: Mapping[str, str], branch: str = "main") -> None:
    """A snapshot that changes no row and carries `properties` (on `branch`)."""
    append = iceberg_table(spark, table).newAppend().toBranch(branch)
    for name, value in properties.items():
        append = append.set(name, value)
    append.commit()


def newest_published(spark: SparkSession, table: str, name: str) -> str | None:
    """The value of summary property `name` in the newest snapshot of `main`'s ancestry that carries it (what readers
    see: a writer's unpublished branch commits are not in it); None if none does (or it has expired)."""
    return newest_published_of(spark, table, (name,)).get(name)


def newest_published_of(spark: SparkSession, table: str, names: Iterable[str]) -> dict[str, str]:
    """`newest_published` of each of `names` that some snapshot carries, in one walk of `main`'s ancestry."""
    return {name: value for name, (value, _) in _newest_carriers(spark, table, names).items()}


def newest_carriers_committed_at(spark: SparkSession, table: str, names: Iterable[str]) -> datetime | None:
    """When the oldest of the newest published snapshots carrying each of `names` was committed (None if none carries
    any): snapshot expiry older than this keeps every one of them."""
    oldest = min((committed for _, committed in _newest_carriers(spark, table, names).values()), default=None)
    return datetime.fromtimestamp(oldest / 1000, UTC) if oldest is not None else None


def _newest_carriers(spark: SparkSession, table: str, names: Iterable[str]) -> dict[str, tuple[str, int]]:
    """By name, the value in the newest snapshot of `main`'s ancestry that carries it, and when that snapshot was
    committed (epoch milliseconds): from the table's metadata, no request."""
    wanted, found = set(names), {}
    loaded = iceberg_table(spark, table)
    snapshot = loaded.currentSnapshot()
    while snapshot is not None and wanted - found.keys():
        summary = snapshot.summary()
        for name in wanted - found.keys():
            if (value := summary.get(name)) is not None:
                found[name] = (value, snapshot.timestampMillis())
        parent = snapshot.parentId()
        snapshot = loaded.snapshot(parent) if parent is not None else None
    return found


def branch_summary(spark: SparkSession, table: str, branch: str) -> dict[str, str]:
    """The summary of the head of `branch` ({} without one), as the session's catalog holds the table (after this
    session's own commit, no request)."""
    snapshot = iceberg_table(spark, table).snapshot(branch)
    return dict(snapshot.summary()) if snapshot is not None else {}


# A compare-and-set of table properties retried this often when another commit to the table came between its read
# and its commit.
PROPERTY_SET_ATTEMPTS = 10
# What a commit that lost the catalog's compare-and-swap raises (py4j names the JVM's exception in its message).
COMMIT_CONFLICT = "CommitFailedException"


def compare_and_set_properties(spark: SparkSession, table: str, update: Callable[[Mapping[str, str]], Mapping[str, str] | None]) -> bool:
    """Sets the properties `update` returns for the table's current properties (None: none), atomically: committed by
    the catalog's compare-and-swap against the metadata `update` saw, and on a conflict read and decided again (an
    `ALTER TABLE ... SET TBLPROPERTIES` re-applies its values to whatever metadata won, deciding nothing again).
    Whether it set them."""
    for _ in range(PROPERTY_SET_ATTEMPTS):
        operations = iceberg_table(spark, table).operations()
        base = operations.refresh()
        current = dict(base.properties())
        values = update(current)
        if values is None:
            return False
        merged = spark._jvm.java.util.HashMap()
        for name, value in {**current, **values}.items():
            merged.put(name, value)
        try:
            operations.commit(base, base.replaceProperties(merged))
            return True
        except Exception as error:  # noqa: BLE001 - py4j wraps the JVM's exceptions; anything but a conflict is re-raised
            if COMMIT_CONFLICT not in str(error):
                raise
    raise RuntimeError(f"{table}: its properties kept changing while this writer set them ({PROPERTY_SET_ATTEMPTS} attempts)")


def iceberg_table(spark: SparkSession, table: str):
    return spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, dotted_name(table))
