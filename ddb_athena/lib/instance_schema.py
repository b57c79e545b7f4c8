"""The Dagster instance's schema, migrated only behind a gate (deploy/platform.sh runs `ddb-athena instance-migrate` at
each platform start).

A new image whose Dagster needs a newer schema would migrate the database before its health check; if the image then
failed, the service's circuit breaker would roll back to the old image on a schema it may not read. So a start that
finds a migration due refuses it (the task fails, the deployment rolls back, the alert says why) unless the deployment
names a snapshot of the database taken for it (`SchemaMigrationSnapshot`): available, of this instance, and taken
within a day. Then it migrates. A start that finds the schema current, or a database without it (a first start),
does what `dagster instance migrate` does and goes on."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# A snapshot older than this was taken for another upgrade: the one named must be this one's.
SNAPSHOT_MAX_AGE = timedelta(days=1)


class SchemaGateError(RuntimeError):
    """A migration is due and the deployment has not opened the gate; the message says what to do."""


@dataclass(frozen=True)
class SchemaState:
    database: str | None  # the revision the database is at; None: no schema yet (a first start)
    head: str  # the revision this image's Dagster needs

    @property
    def migration_due(self) -> bool:
        return self.database is not None and self.database != self.head


def schema_state(instance) -> SchemaState:
    """Where the instance's PostgreSQL schema is, against this image's Dagster (its storages share one alembic table)."""
    from dagster._core.storage.sql import check_alembic_revision
    from dagster_postgres.run_storage import run_storage
    from dagster_postgres.utils import pg_alembic_config

    storage = instance.run_storage
    with storage.connect() as connection:
        database, head = check_alembic_revision(pg_alembic_config(run_storage.__file__), connection)
    return SchemaState(database, head if isinstance(head, str) else ",".join(head))


def check_snapshot(rds, snapshot_id: str, instance_id: str, now: datetime | None = None) -> str:
    """Refuses a snapshot that is not a recent, available one of this database instance; returns how it was checked."""
    now = now or datetime.now(UTC)
    try:
        (snapshot,) = rds.describe_db_snapshots(DBSnapshotIdentifier=snapshot_id)["DBSnapshots"]
    except rds.exceptions.DBSnapshotNotFoundFault:
        raise SchemaGateError(f"SchemaMigrationSnapshot={snapshot_id!r}: no such snapshot") from None
    if snapshot["DBInstanceIdentifier"] != instance_id:
        raise SchemaGateError(f"SchemaMigrationSnapshot={snapshot_id!r} is a snapshot of {snapshot['DBInstanceIdentifier']}, not of {instance_id}")
    if snapshot["Status"] != "available":
        raise SchemaGateError(f"SchemaMigrationSnapshot={snapshot_id!r} is {snapshot['Status']}: wait until it is available, then deploy again")
    taken = snapshot["SnapshotCreateTime"]
    if now - taken > SNAPSHOT_MAX_AGE:
        raise SchemaGateError(f"SchemaMigrationSnapshot={snapshot_id!r} was taken {taken.isoformat()}, more than a day ago: take one for this upgrade")
    return f"snapshot {snapshot_id} of {instance_id}, taken {taken.isoformat()}"


def migrate_behind_gate(instance, rds, instance_id: str | None, snapshot_id: str | None, log=print) -> SchemaState:
    """Migrates the instance when its schema is current or new; when a migration is due, only with a snapshot."""
    state = schema_state(instance)
    if state.migration_due:
        if not snapshot_id or not instance_id:
            raise SchemaGateError(
                f"The instance's schema is at {state.database}, and this image's Dagster needs {state.head}: a migration "
                "the previous image cannot roll back from. Snapshot the database, then deploy again naming it "
                "(SchemaMigrationSnapshot; docs/operations.md, 'Upgrade')."
            )
        log(f"Migrating the instance's schema from {state.database} to {state.head}, behind {check_snapshot(rds, snapshot_id, instance_id)}")
    instance.upgrade(print_fn=log)
    return schema_state(instance)
