"""The export load: both layouts, typed columns, insert-only idempotence, mutations, bad input."""

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from ddb_athena.dev.simulate import order_item
from ddb_athena.exported.partition_load import ExportLoadRequest, ExportUpkeep, load_export_partition
from ddb_athena.lake.commit_properties import empty_commit, newest_published
from ddb_athena.lake.export_load import ExportDataFile, gzip_problem, load_export_files
from ddb_athena.lake.writer_branch import FENCE_EPOCH_PROPERTY, WriterBranch, WriterFencedError
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.quarantine import quarantined_records
from ddb_athena_tests.exported.aws_layout import full_line, gzip_lines, incremental_line, write_export

DAY = datetime(2026, 11, 20, tzinfo=UTC)
EXPORTED_AT = datetime(2026, 11, 21, tzinfo=UTC)


def orders(count: int, seed: int = 1, start: datetime = DAY) -> list[dict]:
    rng = random.Random(seed)
    return [order_item(rng, start + timedelta(hours=5 * index)) for index in range(count)]


class ExportLoad:
    def __init__(self, spark, settings):
        self.spark, self.s3 = spark, settings.client("s3")
        self.layout = SourceLayout(settings.bucket, "orders_export")
        self.table = f"{settings.namespace}.orders"
        self.loads = 0

    def write(self, files, manifest: bool = True, **options) -> list[ExportDataFile]:
        """Export files in S3, with the items per file that their manifest gives (None without one)."""
        written = write_export(self.s3, self.layout.bucket, f"orders_export/test-{self.loads}-{len(files)}", files, manifest=manifest, **options)
        counts = written["data_file_items"] if manifest else [None] * len(written["data_files"])
        return [ExportDataFile(self.layout.uri(key, "s3a"), items) for key, items in zip(written["data_files"], counts, strict=False)]

    def load(self, files: list[ExportDataFile]):
        self.loads += 1
        quarantine = self.layout.uri(f"{self.layout.quarantine_prefix}load-{self.loads}", "s3a")
        return load_export_files(self.spark, declared("orders").spec, self.table, files, quarantine, EXPORTED_AT)

    def rows(self) -> dict[str, dict]:
        return {row["order_id"]: row.asDict() for row in self.spark.table(self.table).collect()}

    def quarantined(self) -> list[dict]:
        return quarantined_records(self.s3, self.layout)


@pytest.fixture
def export_load(spark, settings):
    return ExportLoad(spark, settings)


def test_a_full_export_loads_typed_columns_partitioned_by_day_and_a_reload_adds_nothing(export_load):
    items = orders(10)
    keys = export_load.write([[full_line(item) for item in items[:6]], [full_line(item) for item in items[6:]]])
    first = export_load.load(keys)
    assert (first.items_read, first.rows_inserted, first.duplicates_skipped, first.mutated_documents) == (10, 10, 0, 0)
    assert first.snapshot_id and first.accounted_for == first.items_read

    rows = export_load.rows()
    item = items[3]
    row = rows[item["order_id"]["S"]]
    assert row["amount"] == Decimal(item["amount"]["N"]) and row["currency"] == item["currency"]["S"]
    assert row["created_at"] == datetime.fromisoformat(item["created_at"]["S"].replace("Z", "+00:00")).replace(tzinfo=None)
    assert row["paid"] is item["paid"]["BOOL"] and '"sku"' in row["items"]
    assert row["_changed_at"] == EXPORTED_AT.replace(tzinfo=None)  # a full export is the table as of its export time
    partitions = export_load.spark.sql(f"SELECT partition.created_at_day FROM {export_load.table}.partitions").collect()
    assert len(partitions) == len({item["created_at"]["S"][:10] for item in items})

    again = export_load.load(keys)
    assert (again.rows_inserted, again.duplicates_skipped, again.mutated_documents) == (0, 10, 0)
    assert len(export_load.rows()) == 10


def test_an_incremental_export_inserts_new_documents_counts_deletes_and_changed_documents(export_load):
    existing = orders(4)
    export_load.load(export_load.write([[full_line(item) for item in existing]]))
    changed = dict(existing[0], amount={"N": "1.00"})
    new = orders(3, seed=2, start=DAY + timedelta(days=1))
    written = DAY + timedelta(days=1, hours=3)
    lines = [incremental_line(item, {"order_id": item["order_id"]}, written) for item in new]
    lines.append(incremental_line(changed, {"order_id": changed["order_id"]}, written, old_image=existing[0]))
    lines.append(incremental_line(existing[1], {"order_id": existing[1]["order_id"]}, written))  # unchanged: a duplicate
    lines.append(incremental_line(None, {"order_id": existing[2]["order_id"]}, written))  # a delete
    result = export_load.load(export_load.write([lines], export_type="INCREMENTAL_EXPORT"))

    assert (result.items_read, result.rows_inserted, result.duplicates_skipped, result.deletes_ignored) == (6, 3, 2, 1)
    assert result.mutated_documents == 1 and result.mutated_keys_sample == [changed["order_id"]["S"]]
    assert result.accounted_for == result.items_read
    rows = export_load.rows()
    assert len(rows) == 7 and rows[existing[0]["order_id"]["S"]]["amount"] == Decimal(existing[0]["amount"]["N"])  # never rewritten
    assert existing[2]["order_id"]["S"] in rows  # documents are immutable: a delete is not applied
    assert rows[new[0]["order_id"]["S"]]["_changed_at"] == written.replace(tzinfo=None)


def test_the_same_document_twice_in_a_batch_loads_once_and_reordered_attributes_are_not_a_change(export_load):
    (item,) = orders(1)
    reordered = dict(reversed(list(item.items())))
    other = orders(1, seed=5)[0]
    mutated_copy = dict(other, currency={"S": "XXX"})
    result = export_load.load(export_load.write([[full_line(item), full_line(reordered), full_line(other)], [full_line(mutated_copy)]]))
    assert (result.items_read, result.rows_inserted, result.duplicates_skipped) == (4, 2, 2)
    assert result.mutated_documents == 1 and result.mutated_keys_sample == [other["order_id"]["S"]]
    assert result.accounted_for == result.items_read


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest counts", "no manifest: gzip check"])
def test_bad_lines_and_a_corrupt_gzip_are_quarantined_with_reasons_and_the_rest_loads(export_load, manifest):
    good = orders(5)
    missing_key = {k: v for k, v in orders(1, seed=3)[0].items() if k != "order_id"}
    bad_date = dict(orders(1, seed=4)[0], created_at={"S": "yesterday-ish"})
    bad_amount = dict(orders(1, seed=6)[0], amount={"N": "12.345"})
    lines = [full_line(item) for item in good] + ["{not json", full_line(missing_key), full_line(bad_date), full_line(bad_amount)]
    sound_then_cut = gzip_lines([full_line(item) for item in orders(50, seed=7)])
    truncated = sound_then_cut[: len(sound_then_cut) // 2]
    files = export_load.write([lines], raw={"truncated": (truncated, 50)}, manifest=manifest)

    result = export_load.load(files)
    assert result.items_read > 9  # the lines readable before the damage are read too
    assert result.rows_inserted == 5 + result.items_read - 9
    assert result.records_quarantined == 4 and len(result.corrupt_files) == 1
    reasons = {line["reason"] for line in export_load.quarantined()}
    assert {"not valid JSON", "missing required attribute order_id (S)", "attribute created_at is not a valid timestamp"} <= reasons
    assert "attribute amount has more digits than decimal(18,2) keeps" in reasons
    corrupt = [line for line in export_load.quarantined() if line["reason"].startswith("corrupt")]
    assert len(corrupt) == 1 and corrupt[0]["source_file"].rsplit("/", 1)[1] == files[-1].uri.rsplit("/", 1)[1]
    assert "the rest is lost" in corrupt[0]["reason"]
    assert all("line" in line for line in export_load.quarantined() if not line["reason"].startswith("corrupt"))
    assert result.accounted_for == result.items_read < 9 + 50  # what the damage took is not in the count: the reconciliation shows it
    assert sum(result.quarantine_reasons.values()) == 5


def test_gzip_problem_tells_sound_truncated_garbled_and_concatenated_files_apart():
    body = gzip_lines(["a", "b", "c"])
    assert gzip_problem(body) == (3, None)
    assert gzip_problem(body + gzip_lines(["d"])) == (4, None)
    lines, problem = gzip_problem(body[:-6])
    assert problem and "truncated" in problem
    assert gzip_problem(b"plain text\n")[1].startswith("corrupt gzip")
    garbled = bytearray(gzip_lines([str(i) * 50 for i in range(2000)]))
    garbled[len(garbled) // 2 : len(garbled) // 2 + 40] = b"\x00" * 40
    assert gzip_problem(bytes(garbled))[1].startswith("corrupt gzip")


def test_a_table_created_before_the_spec_gained_write_properties_takes_them_on_the_next_load(export_load):
    from dataclasses import replace

    from ddb_athena.lake.change_merge import ensure_table, table_properties

    ensure_table(export_load.spark, replace(declared("orders").spec, properties=()), export_load.table)
    assert "write.parquet.dict-size-bytes" not in table_properties(export_load.spark, export_load.table)
    export_load.load(export_load.write([[full_line(item) for item in orders(2)]]))
    properties = table_properties(export_load.spark, export_load.table)
    assert all(properties[name] == value for name, value in declared("orders").spec.properties)


def test_the_load_plans_with_its_own_settings_and_gives_the_session_back_as_it_was(export_load):
    spark = export_load.spark
    mine = {"spark.sql.adaptive.enabled": "true", "spark.sql.optimizer.windowGroupLimitThreshold": "500"}
    previous = {name: spark.conf.get(name) for name in mine}
    try:
        for name, value in mine.items():
            spark.conf.set(name, value)
        result = export_load.load(export_load.write([[full_line(item) for item in orders(3)]]))
        assert (result.items_read, result.rows_inserted) == (3, 3)  # counts observed under the load's static plan
        assert {name: spark.conf.get(name) for name in mine} == mine
    finally:
        for name, value in previous.items():
            spark.conf.set(name, value)


def test_a_load_whose_table_another_writer_took_meanwhile_publishes_nothing(spark, export_load):
    export_load.load(export_load.write([[full_line(item) for item in orders(4)]]))
    before = export_load.rows()
    files = export_load.write([[full_line(item) for item in orders(3, seed=2, start=DAY + timedelta(days=1))]])
    paused = WriterBranch(lambda: spark, "lake", (export_load.table,), "paused", 1)

    def taken_meanwhile():
        # Right before the MERGE: this writer is paused past its lease, and the next one takes the table.
        WriterBranch(lambda: spark, "lake", (export_load.table,), "next", 2).take(export_load.table)

    quarantine = export_load.layout.uri(f"{export_load.layout.quarantine_prefix}fenced", "s3a")
    with pytest.raises(WriterFencedError):
        load_export_files(spark, declared("orders").spec, export_load.table, files, quarantine, EXPORTED_AT, before_commit=taken_meanwhile, writer=paused)
    assert export_load.rows() == before


def _load_request(export_load, files: list[ExportDataFile], token: str, epoch: int, now: datetime) -> ExportLoadRequest:
    quarantine = export_load.layout.uri(f"{export_load.layout.quarantine_prefix}{token}", "s3a")
    return ExportLoadRequest(
        "orders", export_load.table, "lake", files, quarantine, EXPORTED_AT, ExportUpkeep(1, 1, 1), now, writer_token=token, writer_epoch=epoch
    )


def test_a_load_whose_publication_an_older_writers_upkeep_beat_takes_the_table_again_and_loads_once(spark, export_load):
    """An older writer's upkeep commits to main between the load's take and its publication (no newer epoch): the load
    still holds the table, so it takes it again and loads, once, instead of failing its run."""
    export_load.load(export_load.write([[full_line(item) for item in orders(2)]]))
    files = export_load.write([[full_line(item) for item in orders(3, seed=2, start=DAY + timedelta(days=1))]])
    checks = []

    def an_older_writers_upkeep_first():
        checks.append(1)
        if len(checks) == 2:  # its checks: before the take, then before the MERGE, when the old writer's compaction lands
            empty_commit(spark, export_load.table, {})

    outcome = load_export_partition(spark, _load_request(export_load, files, "live", 2, datetime.now(UTC)), before_commit=an_older_writers_upkeep_first)
    assert len(checks) == 3 and outcome.load.rows_inserted == 3  # checked before the take, then before each MERGE: taken again
    assert len(export_load.rows()) == 5


def test_a_stale_loads_upkeep_waits_for_no_newer_writer_and_changes_nothing_on_main(spark, export_load):
    """The load's daily upkeep commits to main itself: a load whose table a newer holding fenced after its publication
    (its job outlived its run) runs none of it."""
    export_load.load(export_load.write([[full_line(item) for item in orders(2)]]))
    files = export_load.write([[full_line(item) for item in orders(1, seed=3, start=DAY + timedelta(days=2))]])
    checks = []

    def taken_after_the_load():
        checks.append(1)
        if len(checks) == 3:  # its checks: before the take, before the MERGE, before the upkeep
            WriterBranch(lambda: spark, "lake", (export_load.table,), "next", 3).take(export_load.table)

    with pytest.raises(WriterFencedError, match="this writer's upkeep does not run"):
        load_export_partition(spark, _load_request(export_load, files, "stale", 2, datetime.now(UTC) + timedelta(days=3)), before_commit=taken_after_the_load)
    operations = [row["operation"] for row in spark.sql(f"SELECT operation FROM {export_load.table}.snapshots ORDER BY committed_at").collect()]
    assert operations[-1] == "append"  # the newer writer's fence is the newest commit: no rewrite, no expiry after it
    assert newest_published(spark, export_load.table, FENCE_EPOCH_PROPERTY) == "3"
