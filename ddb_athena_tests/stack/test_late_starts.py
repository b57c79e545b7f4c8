"""The books sync's handovers as on ECS, where a run is a task that takes 30-90 s to start: the real stack, every run
worker's start after the first delayed by 90 s (ddb_athena_bench/delayed_location.py), books written all along, one
stack for both tests. At the hourly handover (sync runs of SYNC_RUN_MINUTES here) the table's commits never pause for
the delay: the next sync run starts and warms up while the running one cycles (streamed/handover.py). ECS stopping the
sync's task (a Spot interruption) costs a handover too, and loses nothing. Minutes of real time: `make test-soak`
(`make test` keeps the same handovers without the delay, test_one_writer.py)."""

import os
import random
import time
from dataclasses import dataclass

import pytest
from dagster import DagsterInstance, DagsterRunStatus

from ddb_athena.dev.local_stack import create_demo_resources
from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lib.settings import Settings
from ddb_athena_bench.delayed_location import DELAY_VARIABLE
from ddb_athena_tests.books_and_orders import BOOKS_WRITER_POOL
from ddb_athena_tests.conftest import point_at_emulator
from ddb_athena_tests.stack.helpers import (
    REPO,
    BookWrites,
    commits,
    dagster_stack,
    dynamodb_items,
    free_port,
    iceberg_rows,
    interrupt_like_spot,
    merging_sync,
    overlaps,
    wait_for,
    writer_runs,
)

pytestmark = pytest.mark.soak

RUN_START_DELAY_SECONDS = 90
INTERVAL_SECONDS = 10
# A run's successor is launched in its last minute and a half: runs of 4 minutes hand over every 4 minutes and leave
# each run 2.5 minutes with no successor on its way, for a Spot interruption's successor to be the sensor's.
SYNC_RUN_MINUTES = 4
LAUNCHED_BEFORE_THE_END_SECONDS = 90


@dataclass(frozen=True)
class LateStack:
    settings: Settings
    instance: DagsterInstance


def started_late(instance: DagsterInstance, run_id: str) -> bool:
    record = instance.get_run_record_by_id(run_id)
    return bool(record and record.start_time) and record.start_time - record.create_timestamp.timestamp() >= RUN_START_DELAY_SECONDS


@pytest.fixture(scope="module")
def late_stack(moto_endpoint, warehouse, tmp_path_factory):
    """The real stack with the sync's interval at INTERVAL_SECONDS and its runs SYNC_RUN_MINUTES long; once its first sync run
    merged, every later run worker starts RUN_START_DELAY_SECONDS late, and books are written every second. After the
    last test, library.books must hold DynamoDB's books, and no two runs held it at once."""
    home = tmp_path_factory.mktemp("dagster_home")
    with pytest.MonkeyPatch.context() as patch:
        point_at_emulator(patch, moto_endpoint, warehouse)
        settings = Settings.from_env()
        create_demo_resources(settings)
        books = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"], rng=random.Random(5))
        for _ in range(10):
            books.insert()
        workspace = home / "workspace.yaml"
        workspace.write_text(f"load_from:\n  - python_module:\n      module_name: ddb_athena_bench.delayed_location\n      working_directory: {REPO}\n")
        delay = home / "run_start_delay"
        delay.write_text("0")  # the first sync run starts at once: the delay matters at the handovers
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            DELAY_VARIABLE: str(delay),
            "DDB_ATHENA_MERGE_INTERVAL_SECONDS": str(INTERVAL_SECONDS),
            "DDB_ATHENA_SYNC_RUN_MINUTES": str(SYNC_RUN_MINUTES),
        }
        writes = BookWrites(books, every=1.0)
        with dagster_stack(home, free_port(), env, workspace=workspace), DagsterInstance.from_config(str(home)) as instance:
            try:
                wait_for("the first books_sync run to merge", lambda: commits(instance), timeout=300, poll=5)
                delay.write_text(str(RUN_START_DELAY_SECONDS))
                writes.start()
                yield LateStack(settings, instance)
            finally:
                writes.stop()
            assert overlaps(instance, writer_runs(instance, BOOKS_WRITER_POOL), f"{settings.namespace}.books") == []
            expected = dynamodb_items(settings, settings.dynamodb_tables["books"], "id")

            def caught_up():
                return {row["id"] for row in iceberg_rows(settings.warehouse, settings.namespace, "books")} == set(expected)

            wait_for("library.books to catch up with DynamoDB", caught_up, timeout=120, poll=5)


def test_with_runs_starting_90_s_late_the_sync_hands_over_without_a_pause_in_its_commits(late_stack):
    instance = late_stack.instance

    def late_handovers() -> list[tuple]:
        """(last commit of a run, first commit of the next) where that next run started at least the delay late."""
        merged = commits(instance)
        pairs = [(earlier, later) for earlier, later in zip(merged, merged[1:], strict=False) if later.run_id != earlier.run_id]
        return [(earlier, later) for earlier, later in pairs if started_late(instance, later.run_id)]

    wait_for("a handover to a sync run that started late", late_handovers, timeout=SYNC_RUN_MINUTES * 60 + 300, poll=5)
    time.sleep(2 * INTERVAL_SECONDS)
    handovers = late_handovers()
    gaps = [later.timestamp - earlier.timestamp for earlier, later in handovers]
    print(f"\nCommits a handover apart (s): {', '.join(f'{gap:.1f}' for gap in gaps)}; run start delay {RUN_START_DELAY_SECONDS} s")
    # The delay falls outside the handover: the next run's first commit follows the last of its predecessor by a cycle
    # or two (11 s on a quiet machine, 40 s beside two busy test workers), where a successor that starts only once its
    # predecessor has ended pays the whole delay, then its process's and JVM's start, before its first commit.
    assert max(gaps) < RUN_START_DELAY_SECONDS
    for earlier, _ in handovers:
        predecessor = instance.get_run_by_id(earlier.run_id)
        assert predecessor.status == DagsterRunStatus.SUCCESS
        assert any("is ready and takes over" in (entry.user_message or "") for entry in instance.all_logs(predecessor.run_id))


def test_with_runs_starting_90_s_late_ecs_stopping_the_syncs_task_costs_a_handover_and_loses_nothing(late_stack):
    """A Fargate Spot interruption as ECS delivers it: SIGTERM to the run worker, SIGKILL 120 s later. The run syncs on
    while its successor starts 90 s late, its successor is launched at once by the sensor (not at a minute tick, not
    after the run ended), and the run ends by itself before the kill, successfully; nothing is lost."""
    instance = late_stack.instance

    def merging_with_time_to_spare():
        """A merging sync run with no successor on its way, and 30 s at least before the schedule launches one."""
        found = merging_sync(instance, alone=True)
        started = found and instance.get_run_record_by_id(found[0].run_id).start_time
        return found if found and time.time() - started < SYNC_RUN_MINUTES * 60 - LAUNCHED_BEFORE_THE_END_SECONDS - 30 else None

    victim, pid = wait_for("a sync run merging, no successor on its way", merging_with_time_to_spare, timeout=SYNC_RUN_MINUTES * 60 + 180)
    stopped = interrupt_like_spot(instance, victim.run_id, pid)
    last = max(commit.timestamp for commit in commits(instance) if commit.run_id == victim.run_id)
    print(
        f"Its worker ended after {stopped.worker_ended_after:.0f} s (killed at the task's end: {', '.join(stopped.killed) or 'none'}); "
        f"commits {stopped.successors_first_commit - last:.1f} s apart; run start delay {RUN_START_DELAY_SECONDS} s"
    )
