"""The books sync's hourly handover as on ECS, where a run is a task that takes 30-90 s to start: the real stack, every
run worker's start delayed by 90 s (ddb_athena_bench/delayed_location.py), sync runs of one minute so that the test
sees a handover, books written all along. The table's commits never pause for the delay: the next sync run starts and
warms up while the running one cycles (streamed/handover.py)."""

import os
import random
import threading
import time

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lib.writer_lease import BOOKS_WRITER_POOL
from ddb_athena_bench.delayed_location import DELAY_VARIABLE
from ddb_athena_tests.stack.test_one_writer import REPO, dagster_stack, dynamodb_items, free_port, iceberg_rows, overlaps, wait_for, writer_runs

pytestmark = [pytest.mark.stack, pytest.mark.xdist_group("stack")]

RUN_START_DELAY_SECONDS = 90
INTERVAL_SECONDS = 5


def commits(instance: DagsterInstance) -> list:
    """The books_iceberg materializations that merged changes, oldest first."""
    records = instance.fetch_materializations(AssetKey("books_iceberg"), limit=1000, ascending=True).records
    return [record for record in records if record.asset_materialization.metadata["files_consumed"].value]


def test_with_runs_starting_90_s_late_the_sync_hands_over_without_a_pause_in_its_commits(settings, tmp_path):
    dynamodb = settings.client("dynamodb")
    books = BookSimulator(dynamodb, settings.books_table, rng=random.Random(5))
    for _ in range(10):
        books.insert()
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - python_module:\n      module_name: ddb_athena_bench.delayed_location\n      working_directory: {REPO}\n")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path),
        DELAY_VARIABLE: str(RUN_START_DELAY_SECONDS),
        "DDB_ATHENA_SYNC_RUN_MINUTES": "1",
        "DDB_ATHENA_MERGE_INTERVAL_SECONDS": str(INTERVAL_SECONDS),
    }
    stop_writing = threading.Event()

    def write():
        while not stop_writing.wait(0.5):
            books.step()

    writer = threading.Thread(target=write)
    with dagster_stack(tmp_path, free_port(), env, workspace=workspace), DagsterInstance.from_config(str(tmp_path)) as instance:
        try:
            wait_for("the first books_sync run to merge", lambda: commits(instance), timeout=300, poll=5)
            writer.start()

            def handed_over():
                return len({record.run_id for record in commits(instance)}) >= 2

            wait_for("a handover to the next sync run", handed_over, timeout=360, poll=5)
            time.sleep(2 * INTERVAL_SECONDS)
        finally:
            stop_writing.set()
            if writer.is_alive():
                writer.join()

        merged = commits(instance)
        first_of_each_run = [later for earlier, later in zip(merged, merged[1:], strict=False) if later.run_id != earlier.run_id]
        gaps = [later.timestamp - earlier.timestamp for earlier, later in zip(merged, merged[1:], strict=False) if later.run_id != earlier.run_id]
        print(f"\nCommits a handover apart (s): {', '.join(f'{gap:.1f}' for gap in gaps)}; run start delay {RUN_START_DELAY_SECONDS} s")
        assert len(first_of_each_run) >= 1
        # The delay falls outside the handover: the next run's first commit comes about an interval and a cycle after the
        # last of its predecessor, where a successor starting only once its predecessor ends waits out the 90 s.
        assert max(gaps) < RUN_START_DELAY_SECONDS / 3
        predecessor = instance.get_run_by_id(merged[0].run_id)
        assert predecessor.status == DagsterRunStatus.SUCCESS
        messages = [entry.user_message for entry in instance.all_logs(predecessor.run_id)]
        assert any("is ready and takes over" in message for message in messages)
        assert overlaps(instance, writer_runs(instance, BOOKS_WRITER_POOL)) == []

        expected = dynamodb_items(settings, settings.books_table, "id")

        def caught_up():
            return {row["id"] for row in iceberg_rows(settings.warehouse, settings.namespace, "books")} == set(expected)

        wait_for("library.books to catch up with DynamoDB", caught_up, timeout=120, poll=5)
