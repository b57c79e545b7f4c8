"""Positions committed with the data: kept in memory until the commit that carries them, put back when a cycle fails;
the change files held with them."""

import gc
from pathlib import Path

from ddb_athena.streamed.capture.checkpoints import CommittedCheckpoints, ShardCheckpoint, positions_from_json, positions_json
from ddb_athena.streamed.capture.held_changes import HeldChanges

ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/books/stream/2026-11-26T00:00:00.000"


class NoS3Checkpoints:
    """The fallback: checkpoints an earlier version kept in S3."""

    def __init__(self, checkpoints=()):
        self.checkpoints = list(checkpoints)

    def load_all(self):
        return self.checkpoints


def test_positions_round_trip_through_the_summary_text_without_the_fields_they_do_not_need():
    checkpoints = [
        ShardCheckpoint(ARN, "shard-1", sequence_number="100", updated_at="2026-11-26T00:00:00+00:00"),
        ShardCheckpoint(ARN, "shard-2", parent_shard_id="shard-1", seen_empty_at="2026-11-26T00:00:01+00:00", finished=True, change_file="local.jsonl"),
    ]
    text = positions_json(checkpoints)
    assert "change_file" not in text and text.count(ARN) == 1
    assert positions_from_json(text) == [checkpoints[0], ShardCheckpoint(ARN, "shard-2", "shard-1", None, "2026-11-26T00:00:01+00:00", True)]


def test_the_positions_move_in_memory_and_become_the_committed_ones_only_when_told():
    committed = positions_json([ShardCheckpoint(ARN, "shard-1", sequence_number="100", updated_at="2026-11-26T00:00:00+00:00")])
    store = CommittedCheckpoints(lambda: committed, NoS3Checkpoints())
    (start,) = store.load_all()
    assert start.sequence_number == "100" and not store.changed

    store.save(ShardCheckpoint(ARN, "shard-1", sequence_number="200"))
    assert store.changed and '"200"' in store.positions_json()
    store.rollback()  # the cycle failed: its records are read again
    assert [c.sequence_number for c in store.load_all()] == ["100"] and not store.changed

    store.save(ShardCheckpoint(ARN, "shard-1", sequence_number="300"))
    store.commit()
    store.rollback()  # nothing uncommitted to put back
    assert [c.sequence_number for c in store.load_all()] == ["300"] and not store.changed


def test_a_table_without_positions_starts_from_the_checkpoints_in_s3_and_a_restart_before_loading_keeps_its_positions():
    legacy = ShardCheckpoint(ARN, "shard-1", sequence_number="50")
    assert CommittedCheckpoints(lambda: None, NoS3Checkpoints([legacy])).load_all() == [legacy]

    # A bootstrap replaces every position before anything was loaded: its positions stand, not the loaded ones.
    store = CommittedCheckpoints(lambda: None, NoS3Checkpoints([legacy]))
    store.delete_all()
    store.save(ShardCheckpoint(ARN, "shard-9", sequence_number="900"))
    assert [c.shard_id for c in store.load_all()] == ["shard-9"] and store.changed


def test_the_held_change_files_directory_goes_when_the_run_lets_go_and_at_the_latest_with_its_holder():
    held = HeldChanges(CommittedCheckpoints(lambda: None, NoS3Checkpoints()))
    written = Path(held.write("local-1.jsonl", []).removeprefix("file://"))
    assert written.is_file()
    held.close()
    assert not written.parent.exists() and held.files == []
    held.close()  # twice is harmless

    forgotten = HeldChanges(CommittedCheckpoints(lambda: None, NoS3Checkpoints()))
    written = Path(forgotten.write("local-1.jsonl", []).removeprefix("file://"))
    del forgotten
    gc.collect()
    assert not written.parent.exists()
