"""A writer whose lease was taken can no longer change the table: frozen (SIGSTOP, its Python and its JVM) in the middle
of a merge, past its lease, while another writer takes over and commits; resumed, it publishes nothing."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ddb_athena.lake.change_merge import STREAM_POSITIONS_PROPERTY, merge_change_files
from ddb_athena.lake.commit_properties import newest_published
from ddb_athena.lake.writer_branch import WriterBranch, WriterFencedError
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.writer_lease import WriterLease
from ddb_athena_tests.lake.helpers import ChangeFiles, change

TTL = 2.0

# The first writer, in a process of its own: it takes the lease and its branch, and merges the change files it is
# given, stopping at `pause_at` to print "paused" (the test then freezes it) before it goes on.
FROZEN_WRITER = textwrap.dedent(
    """
    import sys
    import boto3
    from ddb_athena.lake import change_merge, writer_branch
    from ddb_athena.lake.change_merge import STREAM_POSITIONS_PROPERTY, merge_change_files, tombstone_table
    from ddb_athena.lib.declarations import declared
    from ddb_athena.lib.resources import IcebergSparkResource
    from ddb_athena.lib.writer_lease import WriterLease

    warehouse, endpoint, bucket, table, pause_at, quarantine, *uris = sys.argv[1:]
    spark = IcebergSparkResource(profile="local", warehouse=warehouse, s3_endpoint_url=endpoint, access_key_id="testing",
                                 secret_access_key="testing", extra_config={"spark.ui.enabled": "false"}).spark_session
    lease = WriterLease(boto3.client("s3"), bucket, table, "the writer that will be frozen", ttl_seconds=float(sys.argv[-1]))
    uris = uris[:-1]
    lease.acquire()
    writer = writer_branch.WriterBranch(lambda: spark, "lake", (table, tombstone_table(table)), lease.token)

    def pausing(module, name):
        original = getattr(module, name)
        def paused(*args, **kwargs):
            print("paused", flush=True)
            sys.stdin.readline()  # the test freezes this process now, and later tells it to go on
            return original(*args, **kwargs)
        setattr(module, name, paused)

    module = writer_branch.WriterBranch if pause_at == "publish" else change_merge
    pausing(module, pause_at)
    try:
        positions = {STREAM_POSITIONS_PROPERTY: "the frozen writer's positions"}
        merge_change_files(spark, declared("books").spec, table, uris, quarantine, writer=writer, commit_properties=positions)
        print("committed", flush=True)
    except writer_branch.WriterFencedError as error:
        print(f"fenced: {error}", flush=True)
    """
)


@pytest.mark.parametrize(
    "pause_at",
    [
        "_tombstones_of",  # its batch looked up against the tombstones, before their append
        "upsert_merge_sql",  # tombstones appended, before the MERGE is planned
        "publish",  # both committed to its branch, before main moves
    ],
)
def test_a_writer_frozen_mid_merge_past_its_lease_changes_nothing_once_resumed(spark, settings, pause_at):
    files = ChangeFiles(spark, settings)
    files.write(change(1, "kept"), change(2, "deleted-by-b"), change(3, "updated"))
    files.merge()
    base = files.present()
    files.delete(base)
    # The frozen writer's batch: a delete (tombstone), an update, an insert.
    first_batch = [files.write(change(10, "deleted-by-b", "REMOVE"), change(11, "updated", name="by the frozen writer"), change(12, "only-frozen"))]
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            FROZEN_WRITER,
            spark.conf.get("spark.sql.catalog.lake.warehouse"),
            os.environ["AWS_ENDPOINT_URL"],
            settings.bucket,
            files.table,
            pause_at,
            files.layout.uri(files.layout.quarantine_prefix + "frozen", "s3a"),
            *(files.layout.uri(key, "s3a") for key in first_batch),
            str(TTL),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its JVM in its process group: one signal freezes both
    )
    try:
        assert first.stdout.readline().strip() == "paused"
        os.killpg(first.pid, signal.SIGSTOP)
        # The next writer takes the expired lease (S3's clock) and commits newer changes of the same keys.
        second = WriterLease(settings.client("s3"), settings.bucket, files.table, "the next writer", ttl_seconds=TTL)
        second.acquire(wait_seconds=6 * TTL)
        writer = WriterBranch(lambda: spark, "lake", (files.table, f"{files.table}_tombstones"), second.token)
        files.merge(
            [files.write(change(20, "deleted-by-b", name="inserted again by the next writer"), change(21, "updated", name="by the next writer"))], writer
        )
        expected = files.rows()
        assert files.names() == {"kept": "kept@1", "deleted-by-b": "inserted again by the next writer", "updated": "by the next writer"}

        os.killpg(first.pid, signal.SIGCONT)
        first.stdin.write("go on\n")
        first.stdin.flush()
        out, _ = first.communicate(timeout=180)
        assert out.startswith("fenced:"), out
        assert files.rows() == expected  # not one row changed by the resumed writer
        tombstones = {row["id"]: row["_sequence_number"] for row in spark.table(f"{files.table}_tombstones").collect()}
        assert "deleted-by-b" not in tombstones  # nor its tombstone
        # Nor the stream positions it committed with its data: a writer that resumes reads none of them.
        assert newest_published(spark, files.table, STREAM_POSITIONS_PROPERTY) is None
        writer.drop()
        second.release()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()


def test_a_writer_branch_is_invisible_until_published_and_gone_when_dropped(spark, settings):
    files = ChangeFiles(spark, settings)
    files.write(change(1, "a"))
    files.merge()
    writer = WriterBranch(lambda: spark, "lake", (files.table, f"{files.table}_tombstones"), "t0ken")
    writer.take_all()
    spark.sql(f"DELETE FROM {writer.ref(files.table)} WHERE id = 'a'")
    assert set(files.names()) == {"a"}  # readers see main
    writer.publish(files.table)
    assert files.names() == {}
    writer.drop()
    assert [row["name"] for row in spark.sql(f"SELECT name FROM {files.table}.refs").collect()] == ["main"]


def test_a_branch_that_another_writer_fenced_cannot_be_published(spark, settings):
    files = ChangeFiles(spark, settings)
    files.write(change(1, "a"))
    files.merge()
    tables = (files.table, f"{files.table}_tombstones")
    old, new = WriterBranch(lambda: spark, "lake", tables, "old"), WriterBranch(lambda: spark, "lake", tables, "new")
    old.take_all()
    new.take_all()  # the fence: an empty commit on main, with nothing else
    spark.sql(f"DELETE FROM {old.ref(files.table)} WHERE id = 'a'")
    with pytest.raises(WriterFencedError, match="another writer has committed since writer_old branched"):
        old.publish(files.table)
    assert set(files.names()) == {"a"}
    old.drop()
    new.drop()


def test_the_fence_repeats_the_stream_positions_so_snapshot_expiry_never_loses_them(spark, settings):
    files = ChangeFiles(spark, settings)
    uris = [files.layout.uri(files.write(change(1, "a")), "s3a")]
    quarantine = files.layout.uri(files.layout.quarantine_prefix + "positions", "s3a")
    merge_change_files(spark, declared("books").spec, files.table, uris, quarantine, commit_properties={STREAM_POSITIONS_PROPERTY: "after record 1"})
    tables = (files.table, f"{files.table}_tombstones")
    for token in ("first", "second"):  # two runs take the table: each fence commit repeats the newest positions
        writer = WriterBranch(lambda: spark, "lake", tables, token, carried=(STREAM_POSITIONS_PROPERTY,))
        writer.take_all()
        writer.drop()  # the run ends
    # Expiry keeps the newest snapshot only: the commit that carried the positions first is gone.
    spark.sql(f"CALL lake.system.expire_snapshots(table => '{files.table}', older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    assert spark.table(f"{files.table}.snapshots").count() == 1
    assert newest_published(spark, files.table, STREAM_POSITIONS_PROPERTY) == "after record 1"
