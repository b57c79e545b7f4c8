from datetime import datetime, timedelta, timezone

from ddb_athena.jobs import books_maintenance
from ddb_athena.spark.change_merge import tombstone_table
from ddb_athena.spark.maintenance import maintain_table
from ddb_athena_tests.dagster_helpers import local_resources
from ddb_athena_tests.spark.helpers import ChangeFiles, change


def test_maintenance_compacts_keeps_recent_snapshots_and_prunes_only_old_tombstones(spark, settings):
    files = ChangeFiles(spark, settings)
    for batch in range(3):
        files.merge([files.write(*[change(batch * 10 + i, f"k{batch}{i}", "INSERT") for i in range(3)])])
    files.merge([files.write(change(100, "k00", "REMOVE"))])
    snapshots = spark.table(f"{files.table}.snapshots").count()

    now = datetime.now(timezone.utc)
    kept = maintain_table(spark, "lake", files.table, timedelta(hours=6), 1, timedelta(days=7), now=now)
    assert kept.rewritten_data_files >= 3 and kept.expired_snapshots == 0 and kept.pruned_tombstones == 0
    assert spark.table(f"{files.table}.snapshots").count() == snapshots + 1  # + the compaction
    assert len(files.names()) == 8

    later = maintain_table(spark, "lake", files.table, timedelta(hours=6), 1, timedelta(days=7), now=now + timedelta(days=8))
    assert later.expired_snapshots >= snapshots and later.pruned_tombstones == 1
    assert spark.table(tombstone_table(files.table)).count() == 0 and len(files.names()) == 8


def test_the_maintenance_job_records_what_it_did_on_the_asset(spark, settings):
    files = ChangeFiles(spark, settings)
    for batch in range(2):
        files.merge([files.write(change(batch + 1, f"k{batch}", "INSERT"))])
    result = books_maintenance.execute_in_process(resources=local_resources())
    (observation,) = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    metadata = observation.event_specific_data.asset_observation.metadata
    assert metadata["maintenance_rewritten_data_files"].value >= 2
