"""A writer whose lease was taken can no longer change the table: frozen (SIGSTOP, its Python and its JVM) in the middle
of a merge, past its lease, while another writer takes over and commits; resumed, it publishes nothing."""

import json
import os
import textwrap

import pytest

from ddb_athena.lake.change_merge import STREAM_POSITIONS_PROPERTY, merge_change_files
from ddb_athena.lake.commit_properties import empty_commit, newest_published
from ddb_athena.lake.writer_branch import FENCE_EPOCH_PROPERTY, WriterBranch, WriterFencedError
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.writer_lease import WriterLease
from ddb_athena_tests.frozen_process import FrozenProcess
from ddb_athena_tests.lake.helpers import ChangeFiles, change

TTL = 2.0

# The first writer, in a process of its own: for each merge it is given (a line of JSON), it takes the lease and its
# branch, and merges the change files, stopping at `pause_at` (before its call, or once it has returned) to print
# "paused" (the test then freezes it) before it goes on; then it waits for the next merge. `split`: the merge takes a
# large table's shape (a MERGE of the keys held, then an append), whatever the table's size.
FROZEN_WRITER = textwrap.dedent(
    """
    import json
    import sys
    import boto3
    from ddb_athena.lake import change_merge, writer_branch
    from ddb_athena.lake.change_merge import STREAM_POSITIONS_PROPERTY, merge_change_files, tombstone_table
    from ddb_athena.lib.declarations import declared
    from ddb_athena.lib.resources import IcebergSparkResource
    from ddb_athena.lib.writer_lease import WriterLease

    warehouse, endpoint = sys.argv[1:]
    spark = IcebergSparkResource(profile="local", warehouse=warehouse, s3_endpoint_url=endpoint, access_key_id="testing",
                                 secret_access_key="testing", extra_config={"spark.ui.enabled": "false"}).spark_session

    def pause():
        print("paused", flush=True)
        sys.stdin.readline()  # the test freezes this process now, and later tells it to go on

    def paused(original, after):
        def pausing(*args, **kwargs):
            if not after:
                pause()
            returned = original(*args, **kwargs)
            if after:
                pause()
            return returned
        return pausing

    one_merge_below_rows = change_merge.ONE_MERGE_BELOW_ROWS

    while line := sys.stdin.readline():
        merge = json.loads(line)
        table, pause_at = merge["table"], merge["pause_at"]
        lease = WriterLease(boto3.client("s3"), merge["bucket"], table, "the writer that will be frozen", ttl_seconds=merge["ttl"])
        lease.acquire()
        writer = writer_branch.WriterBranch(lambda: spark, "lake", (table, tombstone_table(table)), lease.token, lease.epoch)
        module = writer_branch.WriterBranch if pause_at == "publish" else change_merge
        original = getattr(module, pause_at)
        setattr(module, pause_at, paused(original, merge["after"]))
        change_merge.ONE_MERGE_BELOW_ROWS = 0 if merge["split"] else one_merge_below_rows
        try:
            positions = {STREAM_POSITIONS_PROPERTY: "the frozen writer's positions"}
            merge_change_files(spark, declared("books").spec, table, merge["uris"], merge["quarantine"], writer=writer, commit_properties=positions)
            print("committed", flush=True)
        except writer_branch.WriterFencedError as error:
            print(f"fenced: {error}", flush=True)
        finally:
            setattr(module, pause_at, original)
    """
)


def merge_of(files: ChangeFiles, pause_at: str, keys: list[str], after: bool, split: bool) -> str:
    """FROZEN_WRITER's job: the merge of `keys`, pausing at `pause_at` (once it has returned, if `after`)."""
    merge = {"bucket": files.layout.bucket, "table": files.table, "pause_at": pause_at, "after": after, "split": split, "ttl": TTL}
    merge["uris"] = [files.layout.uri(key, "s3a") for key in keys]
    merge["quarantine"] = files.layout.uri(files.layout.quarantine_prefix + "frozen", "s3a")
    return json.dumps(merge)


@pytest.fixture(scope="module")
def frozen_writer():
    writer = FrozenProcess(FROZEN_WRITER)
    yield writer
    writer.stop()


# One worker runs every variant: they share the frozen writer's process.
@pytest.mark.xdist_group("frozen_writer")
@pytest.mark.parametrize(
    ("pause_at", "after", "split"),
    [
        # its batch looked up against the tombstones, before their append
        pytest.param("_tombstones_of", False, False, id="_tombstones_of"),
        # tombstones appended, before the MERGE is planned
        pytest.param("merge_sql", False, False, id="merge_sql"),
        # a large table's shape: the MERGE of the keys held committed to its branch, before the append of the new key
        pytest.param("_merge", True, True, id="between the split's merge and append"),
        # both committed to its branch, before main moves
        pytest.param("publish", False, False, id="publish"),
    ],
)
def test_a_writer_frozen_mid_merge_past_its_lease_changes_nothing_once_resumed(spark, settings, frozen_writer, pause_at, after, split):
    files = ChangeFiles(spark, settings)
    files.write(change(1, "kept"), change(2, "deleted-by-b"), change(3, "updated"))
    files.merge()
    base = files.present()
    files.delete(base)
    # The frozen writer's batch: a delete (tombstone), an update, an insert.
    first_batch = [files.write(change(10, "deleted-by-b", "REMOVE"), change(11, "updated", name="by the frozen writer"), change(12, "only-frozen"))]
    arguments = (spark.conf.get("spark.sql.catalog.lake.warehouse"), os.environ["AWS_ENDPOINT_URL"])
    with frozen_writer.serving(merge_of(files, pause_at, first_batch, after, split), arguments) as first:
        assert first.line() == "paused"
        first.freeze()
        if split:  # its MERGE of the keys held is on its branch, the append of its new key is not
            spark.catalog.refreshTable(files.table)
            (branch,) = [row["name"] for row in spark.sql(f"SELECT name FROM {files.table}.refs WHERE name <> 'main'").collect()]
            on_branch = {row["id"]: row["name"] for row in spark.table(f"{files.table}.branch_{branch}").collect()}
            assert on_branch == {"kept": "kept@1", "updated": "by the frozen writer"}
        # The next writer takes the expired lease (S3's clock) and commits newer changes of the same keys.
        second = WriterLease(settings.client("s3"), settings.bucket, files.table, "the next writer", ttl_seconds=TTL)
        second.acquire(wait_seconds=6 * TTL)
        writer = WriterBranch(lambda: spark, "lake", (files.table, f"{files.table}_tombstones"), second.token, second.epoch)
        files.merge(
            [files.write(change(20, "deleted-by-b", name="inserted again by the next writer"), change(21, "updated", name="by the next writer"))], writer
        )
        expected = files.rows()
        assert files.names() == {"kept": "kept@1", "deleted-by-b": "inserted again by the next writer", "updated": "by the next writer"}

        first.resume()
        outcome = first.line()
        assert outcome.startswith("fenced:"), outcome
    for table in (files.table, f"{files.table}_tombstones"):  # read as committed now, not as this session last saw them
        spark.catalog.refreshTable(table)
    assert files.rows() == expected  # not one row changed by the resumed writer
    tombstones = {row["id"]: row["_sequence_number"] for row in spark.table(f"{files.table}_tombstones").collect()}
    assert "deleted-by-b" not in tombstones  # nor its tombstone
    # Nor the stream positions it committed with its data: a writer that resumes reads none of them.
    assert newest_published(spark, files.table, STREAM_POSITIONS_PROPERTY) is None
    writer.drop()
    second.release()


def test_a_writer_branch_is_invisible_until_published_and_gone_when_dropped(spark, settings):
    files = ChangeFiles(spark, settings)
    files.write(change(1, "a"))
    files.merge()
    writer = WriterBranch(lambda: spark, "lake", (files.table, f"{files.table}_tombstones"), "t0ken", 1)
    writer.take_all()
    spark.sql(f"DELETE FROM {writer.ref(files.table)} WHERE id = 'a'")
    assert set(files.names()) == {"a"}  # readers see main
    writer.publish(files.table)
    assert files.names() == {}
    writer.drop()
    assert [row["name"] for row in spark.sql(f"SELECT name FROM {files.table}.refs").collect()] == ["main"]


def test_a_cycle_that_dies_between_its_merge_and_its_append_publishes_neither_and_its_retry_publishes_both(spark, settings, monkeypatch):
    """The MERGE of the keys held is committed on the branch, the append of the new keys is not: readers see neither;
    the retry over the same files finds the updated row as new as its change and appends the new key."""
    from pyspark.sql import DataFrameWriterV2

    from ddb_athena.lake import change_merge

    monkeypatch.setattr(change_merge, "ONE_MERGE_BELOW_ROWS", 0)  # a large table's two commits
    files = ChangeFiles(spark, settings)
    files.merge([files.write(change(1, "a", "INSERT"))])
    batch = files.write(change(2, "a", name="updated"), change(3, "b", "INSERT"))
    writer = WriterBranch(lambda: spark, "lake", (files.table, f"{files.table}_tombstones"), "t0ken", 1)

    def dies(*_):
        raise RuntimeError("the run dies before its append")

    append = DataFrameWriterV2.append
    monkeypatch.setattr(DataFrameWriterV2, "append", dies)
    with pytest.raises(RuntimeError):
        files.merge([batch], writer=writer)
    monkeypatch.setattr(DataFrameWriterV2, "append", append)
    assert files.names() == {"a": "a@1"}  # readers see main: nothing of the cycle
    retry = files.merge([batch], writer=writer)
    assert files.names() == {"a": "updated", "b": "b@3"}
    assert (retry.stale_skipped, retry.rows_written) == (1, 1)
    writer.drop()


def test_a_branch_that_another_writer_fenced_cannot_be_published(spark, settings):
    files = ChangeFiles(spark, settings)
    files.write(change(1, "a"))
    files.merge()
    tables = (files.table, f"{files.table}_tombstones")
    old, new = WriterBranch(lambda: spark, "lake", tables, "old", 1), WriterBranch(lambda: spark, "lake", tables, "new", 2)
    old.take_all()
    new.take_all()  # the fence: an empty commit on main, with nothing else
    spark.sql(f"DELETE FROM {old.ref(files.table)} WHERE id = 'a'")
    with pytest.raises(WriterFencedError, match="another writer has committed since writer_old branched"):
        old.publish(files.table)
    assert set(files.names()) == {"a"}
    # Nor does its upkeep run, which would commit to main itself; the live writer's does.
    with pytest.raises(WriterFencedError, match=r"a newer writer \(epoch 2\).*this writer's upkeep does not run"):
        old.check_fence()
    new.check_fence()
    old.drop()
    new.drop()


def test_the_fence_repeats_the_stream_positions_so_snapshot_expiry_never_loses_them(spark, settings):
    files = ChangeFiles(spark, settings)
    uris = [files.layout.uri(files.write(change(1, "a")), "s3a")]
    quarantine = files.layout.uri(files.layout.quarantine_prefix + "positions", "s3a")
    merge_change_files(spark, declared("books").spec, files.table, uris, quarantine, commit_properties={STREAM_POSITIONS_PROPERTY: "after record 1"})
    tables = (files.table, f"{files.table}_tombstones")
    for token in ("first", "second"):  # two runs take the table: each fence commit repeats the newest positions
        writer = WriterBranch(lambda: spark, "lake", tables, token, 1, carried=(STREAM_POSITIONS_PROPERTY,))
        writer.take_all()
        writer.drop()  # the run ends
    # Expiry keeps the newest snapshot only: the commit that carried the positions first is gone.
    spark.sql(f"CALL lake.system.expire_snapshots(table => '{files.table}', older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    assert spark.table(f"{files.table}.snapshots").count() == 1
    assert newest_published(spark, files.table, STREAM_POSITIONS_PROPERTY) == "after record 1"


def test_a_writer_whose_lease_was_taken_before_its_take_changes_nothing_and_the_live_writer_goes_on(spark, settings):
    """A writer paused past its lease after its last lease check, before its take (or a job on EMR that starts after its
    run died): its successor holds the next epoch and has fenced the table. Resumed, the stale take finds the newer
    fence and refuses: main stays the live writer's, whose next publication goes through."""
    files = ChangeFiles(spark, settings)
    files.write(change(1, "a"))
    files.merge()
    tables = (files.table, f"{files.table}_tombstones")
    s3 = settings.client("s3")
    first = WriterLease(s3, settings.bucket, files.table, "paused writer", ttl_seconds=TTL)
    first.acquire()
    stale = WriterBranch(lambda: spark, "lake", tables, first.token, first.epoch)
    first.check()  # its last check; then it pauses, and its lease goes to the next writer
    first.release()
    second = WriterLease(s3, settings.bucket, files.table, "live writer", ttl_seconds=TTL)
    second.acquire()
    try:
        live = WriterBranch(lambda: spark, "lake", tables, second.token, second.epoch)
        live.take_all()
        head = spark.sql(f"SELECT snapshot_id FROM {files.table}.refs WHERE name = 'main'").collect()[0][0]
        with pytest.raises(
            WriterFencedError, match=rf"a newer writer \(epoch {second.epoch}\) has taken the table since this one's lease \(epoch {first.epoch}\)"
        ):
            stale.take(files.table)
        assert spark.sql(f"SELECT snapshot_id FROM {files.table}.refs WHERE name = 'main'").collect()[0][0] == head
        spark.sql(f"DELETE FROM {live.ref(files.table)} WHERE id = 'a'")
        live.publish(files.table)  # the live writer was not fenced out
        assert files.names() == {}
        live.drop()
        stale.drop()
    finally:
        second.release()


def test_a_take_whose_main_moved_under_it_reads_main_again_and_a_newer_fence_stops_it(spark, settings, monkeypatch):
    """The take commits its fence by compare-and-swap: a stale writer that read main before its successor fenced it
    cannot move main past that fence (its fast-forward fails), and reading main again it finds the newer epoch."""
    from ddb_athena.lake import writer_branch

    files = ChangeFiles(spark, settings)
    files.write(change(1, "a"))
    files.merge()
    tables = (files.table, f"{files.table}_tombstones")
    stale, live = WriterBranch(lambda: spark, "lake", tables, "stale", 1), WriterBranch(lambda: spark, "lake", tables, "live", 2)
    fence = writer_branch.empty_commit
    interleaved = []

    def successor_fences_first(session, table, properties, branch="main"):
        if branch == stale.name and not interleaved:
            interleaved.append(table)
            live.take(table)  # between the stale writer's read of main and its fence
        return fence(session, table, properties, branch=branch)

    monkeypatch.setattr(writer_branch, "empty_commit", successor_fences_first)
    with pytest.raises(WriterFencedError, match=r"a newer writer \(epoch 2\)"):
        stale.take(files.table)
    assert interleaved == [files.table]
    fences = [row[0] for row in spark.sql(f"SELECT summary['ddb_athena.writer-fence'] FROM {files.table}.snapshots ORDER BY committed_at").collect()]
    assert [name for name in fences if name] == ["writer_live", "writer_stale"]  # the stale fence exists only on its branch
    main = spark.sql(f"SELECT snapshot_id FROM {files.table}.refs WHERE name = 'main'").collect()[0][0]
    assert spark.sql(f"SELECT summary['ddb_athena.writer-fence'] FROM {files.table}.snapshots WHERE snapshot_id = {main}").collect()[0][0] == "writer_live"
    live.drop()
    stale.drop()


def test_an_older_writers_upkeep_on_main_costs_the_live_writer_one_publication_not_the_table(spark, settings):
    """Compaction and expiry commit to main (Iceberg rewrites no branch): a stale writer's upkeep can move main past
    the live writer's fence. The live writer's publication then fails as MainMovedError (no newer epoch on main), and
    its next take fences main again: it goes on writing."""
    from ddb_athena.lake.commit_properties import empty_commit
    from ddb_athena.lake.writer_branch import MainMovedError

    files = ChangeFiles(spark, settings)
    files.write(change(1, "a"))
    files.merge()
    tables = (files.table, f"{files.table}_tombstones")
    live = WriterBranch(lambda: spark, "lake", tables, "live", 2)
    live.take(files.table)
    empty_commit(spark, files.table, {"operation-by": "a stale writer's compaction"})  # on main, after the live fence
    spark.sql(f"DELETE FROM {live.ref(files.table)} WHERE id = 'a'")
    with pytest.raises(MainMovedError, match="by no newer writer"):
        live.publish(files.table)
    assert set(files.names()) == {"a"}
    live.take(files.table)  # fences main again, from where it is now
    spark.sql(f"DELETE FROM {live.ref(files.table)} WHERE id = 'a'")
    live.publish(files.table)
    assert files.names() == {}
    live.drop()


class ConflictingCommit:
    """A SparkSession whose next fast-forward, once armed, meets a commit another process made to the table while
    Iceberg's procedure ran: the commit is made (through a second catalog of the same warehouse, which caches the
    table apart from this session's), and the call fails as Iceberg's procedure then fails (it re-applies its update to
    the metadata it started from: BaseTransaction's PendingUpdateFailedException, caused by a CommitFailedException)."""

    def __init__(self, spark):
        self._spark, self._concurrent_sql = spark, None
        for name, value in spark.sparkContext.getConf().getAll():
            if name.startswith("spark.sql.catalog.lake"):
                spark.conf.set(name.replace("spark.sql.catalog.lake", "spark.sql.catalog.elsewhere"), value)

    def arm(self, concurrent_sql: str) -> None:
        self._concurrent_sql = concurrent_sql

    def sql(self, statement: str):
        if "system.fast_forward" in statement and self._concurrent_sql:
            self._spark.sql(self._concurrent_sql)
            self._concurrent_sql = None
            raise RuntimeError(
                "org.apache.iceberg.BaseTransaction$PendingUpdateFailedException: "
                "org.apache.iceberg.exceptions.CommitFailedException: Table metadata refresh is required"
            )
        return self._spark.sql(statement)

    def __getattr__(self, name):
        return getattr(self._spark, name)


@pytest.mark.parametrize("elsewhere", ["a stale writer's commit to its own branch", "a newer writer's fence on main"])
def test_a_publication_whose_compare_and_swap_lost_to_another_commit_checks_the_fresh_table_again(spark, settings, elsewhere):
    """A fast-forward whose compare-and-swap lost to another commit is called again: it goes through when `main` did
    not move (the other commit was on another branch), and is refused when a newer writer fenced the table meanwhile."""
    files = ChangeFiles(spark, settings)
    files.write(change(1, "a"), change(2, "b"))
    files.merge()
    conflicting = ConflictingCommit(spark)
    live = WriterBranch(lambda: conflicting, "lake", (files.table, f"{files.table}_tombstones"), "live", 2)
    live.take_all()
    spark.sql(f"DELETE FROM {live.ref(files.table)} WHERE id = 'a'")
    if elsewhere.startswith("a newer"):
        spark.sql(f"ALTER TABLE {files.table} CREATE BRANCH writer_newer")
        empty_commit(spark, files.table, {FENCE_EPOCH_PROPERTY: "3"}, branch="writer_newer")
        conflicting.arm(f"CALL elsewhere.system.fast_forward(table => '{files.table}', branch => 'main', to => 'writer_newer')")
        with pytest.raises(WriterFencedError, match="another writer has committed"):
            live.publish(files.table)
        assert files.names() == {"a": "a@1", "b": "b@2"}
    else:
        conflicting.arm(f"ALTER TABLE elsewhere.{files.table} CREATE BRANCH writer_stale")
        live.publish(files.table)
        assert files.names() == {"b": "b@2"}
    assert live.fast_forwards_retried == 1
    live.drop()
