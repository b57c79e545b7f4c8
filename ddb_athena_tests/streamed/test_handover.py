"""The sync's handover from one run to the next (streamed/handover.py): what a running sync run decides at each cycle,
from the runs in the instance, and the sync job doing it against the emulator."""

import os
import signal
import threading
import time

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, instance_for_test

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.streamed.handover import INTERRUPTED_TAG, READY_TAG, SyncHandover, waiting_writers
from ddb_athena_tests.books_and_orders import books_sync_job
from ddb_athena_tests.dagster_helpers import add_run, local_resources, start
from ddb_athena_tests.fake_clock import SkippingClock


def test_alone_a_sync_run_keeps_the_table_until_its_time_is_up():
    with instance_for_test() as instance:
        running = start(instance, add_run(instance))
        handover = SyncHandover(instance, running)
        assert handover.end_reason(time_is_up=False) is None
        assert "no sync run is on its way" in handover.end_reason(time_is_up=True)


def test_past_its_time_a_sync_run_cycles_on_for_a_successor_on_its_way_and_hands_over_once_that_one_is_ready():
    with instance_for_test() as instance:
        running = start(instance, add_run(instance, tags={READY_TAG: "true"}))
        handover = SyncHandover(instance, running)
        successor = add_run(instance)  # launched: its task and JVM are starting
        assert handover.end_reason(time_is_up=True) is None
        successor = start(instance, successor)  # started, warming up: not ready yet
        assert handover.end_reason(time_is_up=True) is None
        SyncHandover(instance, successor).announce_ready()
        assert successor.run_id in handover.end_reason(time_is_up=False)  # ready: it takes over, whatever the time
        # The successor does not take its predecessor, ready before it, for a successor of its own.
        assert SyncHandover(instance, instance.get_run_by_id(successor.run_id)).end_reason(time_is_up=False) is None


def test_a_sigterm_while_the_run_is_not_canceling_is_ridden_out_and_tagged_for_its_successor():
    """ECS stops a Spot task with SIGTERM; a Terminate is a SIGTERM too on ECS, after the run is marked canceling."""
    with instance_for_test() as instance:
        running = start(instance, add_run(instance))
        handover = SyncHandover(instance, running)
        assert not handover.rides_out(signal.SIGINT) and INTERRUPTED_TAG not in instance.get_run_by_id(running.run_id).tags
        assert handover.rides_out(signal.SIGTERM) and INTERRUPTED_TAG in instance.get_run_by_id(running.run_id).tags
        terminated = start(instance, add_run(instance))
        instance.report_run_canceling(terminated)
        assert not SyncHandover(instance, terminated).rides_out(signal.SIGTERM)
        assert INTERRUPTED_TAG not in instance.get_run_by_id(terminated.run_id).tags


def test_a_sync_run_gives_a_table_up_to_a_writer_of_its_pool_queued_or_running_and_to_nothing_else():
    with instance_for_test() as instance:
        running = start(instance, add_run(instance))
        add_run(instance, "books_sync", DagsterRunStatus.STARTED, pools={"books_writer"})  # a sync of an earlier version
        add_run(instance, "books_bootstrap", DagsterRunStatus.SUCCESS, pools={"books_writer"})  # a writer that has ended
        assert waiting_writers(instance) == {} and "books_writer" not in waiting_writers(instance)
        orders = add_run(instance, "orders_daily", pools={"orders_writer"})  # another table's writer
        assert set(waiting_writers(instance)) == {"orders_writer"} and "books_writer" not in waiting_writers(instance)
        for status in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTED):
            writer = add_run(instance, "__ASSET_JOB", status, pools={"books_writer"})  # Materialize, waiting or started
            assert waiting_writers(instance)["books_writer"].run_id == writer.run_id
            assert waiting_writers(instance)["orders_writer"].run_id == orders.run_id
            assert "books_writer" not in waiting_writers(instance, other_than=writer.run_id)  # that writer does not wait for itself
            # The run itself goes on: its cycle gives the table up (assets.sync_cycles), not the handover.
            assert SyncHandover(instance, running).end_reason(time_is_up=False) is None
            instance.delete_run(writer.run_id)


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def run_clock(monkeypatch) -> SkippingClock:
    """The sync job's runs go by a clock that skips their waits: minutes of a run pass in the time of its cycles."""
    clock = SkippingClock()
    monkeypatch.setattr("ddb_athena.streamed.assets.RUN_CLOCK", clock)
    return clock


def sync_job_run(instance, **config):
    return books_sync_job.execute_in_process(
        instance=instance,
        resources=local_resources(),
        run_config={"ops": {"keep_books_in_sync": {"config": {"merge_interval_seconds": 1, **config}}}},
    )


def test_a_sync_job_run_warms_up_says_it_is_ready_syncs_and_hands_over_to_a_ready_successor(spark, settings, instance, run_clock):
    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert()
    # A successor that is ready: the run ends after its first cycle, not after its two minutes.
    successor = add_run(instance, status=DagsterRunStatus.STARTED, tags={READY_TAG: "true"})
    result = sync_job_run(instance, run_minutes=2)
    assert result.success
    assert instance.get_run_by_id(result.run_id).tags[READY_TAG] == "true"
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    first = {prefix: next(i for i, message in enumerate(messages) if message.startswith(prefix)) for prefix in ("Ready to sync", "Took the writer lease")}
    assert first["Ready to sync"] < first["Took the writer lease"]  # warm before it takes the table
    assert any(f"the next sync run {successor.run_id} is ready and takes over" in message for message in messages)
    assert any(message.startswith("Sync run done after 1 cycles") for message in messages)
    # The op job's cycle is recorded on the books assets and their checks, as the asset's is.
    materializations = instance.fetch_materializations(AssetKey("books_iceberg"), limit=5).records
    assert [record.run_id for record in materializations] == [result.run_id]
    assert materializations[0].asset_materialization.metadata["files_consumed"].value >= 1
    assert result.get_asset_check_evaluations()


def test_a_sync_job_run_does_not_start_beside_a_books_writer_of_the_pool(spark, settings, instance, run_clock):
    bootstrap = add_run(instance, "books_bootstrap", DagsterRunStatus.STARTED, pools={"books_writer"})
    result = sync_job_run(instance, run_minutes=2)
    assert result.success
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(f"run {bootstrap.run_id} (books_bootstrap) writes it" in message for message in messages)
    # It leaves books to the bootstrap (it may sync the other streamed tables, whose writers are not waiting).
    assert f"Took the writer lease of {settings.namespace}.books" not in messages
    assert instance.fetch_materializations(AssetKey("books_iceberg"), limit=1).records == []


def test_a_sync_job_run_rides_out_ecs_stopping_its_task_and_ends_by_itself_within_the_grace(spark, settings, instance, monkeypatch, run_clock):
    """SIGTERM with the run not canceling, as ECS stops a Spot task: the run tags itself, syncs on with its cycles back
    to back (its successor takes over from its freshest commit), and ends successfully in time to give its leases up
    before the kill (here a 45-s stop timeout, 25 s of it left for the cycles; a 10-s interval)."""
    monkeypatch.setattr("ddb_athena.streamed.jobs.STOP_TIMEOUT_SECONDS", 45)
    simulator = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"])
    simulator.insert()
    signalled, run_over = [], threading.Event()

    def stop_the_task_after_the_first_cycle():
        while not instance.fetch_materializations(AssetKey("books_iceberg"), limit=1).records:
            time.sleep(0.2)
        # A change already in the stream as ECS stops the task (its tables' first cycles end together, side by side).
        simulator.insert()
        time.sleep(1)
        signalled.append((time.time(), run_clock()))
        os.kill(os.getpid(), signal.SIGTERM)
        while not run_over.wait(0.3):
            simulator.insert()  # changes after the signal, synced by the run it interrupted

    threading.Thread(target=stop_the_task_after_the_first_cycle, daemon=True).start()
    try:
        result = sync_job_run(instance, run_minutes=5, merge_interval_seconds=10)
    finally:
        run_over.set()
    assert result.success and signalled
    assert INTERRUPTED_TAG in instance.get_run_by_id(result.run_id).tags
    signalled_at, signalled_on_run_clock = signalled[0]
    assert run_clock() - signalled_on_run_clock < 45 - 5  # done, leases given up, well before the kill
    records = instance.fetch_materializations(AssetKey("books_iceberg"), limit=100).records
    after = sorted(record.timestamp for record in records if record.timestamp > signalled_at)
    # Back to back, not one cycle every 10 s: at most 3 in the 25 s of the grace at the interval.
    assert len(after) >= 5, [round(moment - signalled_at, 1) for moment in after]
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(message.startswith("SIGTERM with no Terminate") for message in messages)
