"""The runs a stopped `make dev` leaves behind: waited for when it stops, ended when it starts again."""

import os
import subprocess
import sys
import threading

import pytest
from dagster import DagsterEvent, DagsterInstance, DagsterRunStatus, RunRequest, SkipReason, instance_for_test
from dagster._core.storage.dagster_run import DagsterRun

from ddb_athena.dev.cli import main
from ddb_athena.dev.local_runs import LEFT_BEHIND, end_runs_left_in_progress, wait_for_runs_to_end
from ddb_athena_tests.streamed.test_schedules import tick


def add_run(instance, status: DagsterRunStatus, job_name: str = "books_sync") -> str:
    return instance.add_run(DagsterRun(job_name=job_name, status=status)).run_id


def started_in(instance, run_id: str, pid: int) -> None:
    """The run's worker recorded its start from process `pid`, as a run worker does."""
    instance.report_dagster_event(DagsterEvent("PIPELINE_START", job_name="books_sync", pid=pid), run_id=run_id)


def gone_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def status(instance, run_id: str) -> DagsterRunStatus:
    return instance.get_run_by_id(run_id).status


def test_runs_left_in_progress_are_ended_with_the_reason_and_finished_or_waiting_runs_are_left_alone():
    with instance_for_test() as instance:
        left = {add_run(instance, s) for s in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)}
        others = {add_run(instance, s): s for s in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.SUCCESS, DagsterRunStatus.CANCELED)}
        ended, alive = end_runs_left_in_progress(instance)
        assert {run.run_id for run in ended} == left and alive == []
        assert {status(instance, run_id) for run_id in left} == {DagsterRunStatus.FAILURE}
        assert {run_id: status(instance, run_id) for run_id in others} == others
        (failure,) = [r.event_log_entry for r in instance.get_records_for_run(next(iter(left))).records if r.event_log_entry.is_dagster_event]
        assert failure.dagster_event.event_type_value == "PIPELINE_FAILURE" and LEFT_BEHIND in failure.message


@pytest.mark.subprocess
def test_a_run_whose_process_is_alive_is_left_as_it_is_one_whose_process_died_is_ended():
    """Another stack on the same instance keeps its runs; a run whose worker died with its stack is ended."""
    with instance_for_test() as instance:
        live, dead = add_run(instance, DagsterRunStatus.STARTED), add_run(instance, DagsterRunStatus.STARTED)
        started_in(instance, live, os.getpid())
        started_in(instance, dead, gone_pid())
        ended, alive = end_runs_left_in_progress(instance)
        assert [run.run_id for run in ended] == [dead] and [run.run_id for run in alive] == [live]
        assert (status(instance, live), status(instance, dead)) == (DagsterRunStatus.STARTED, DagsterRunStatus.FAILURE)


@pytest.mark.subprocess
def test_the_real_sequence_a_sync_run_left_started_by_a_stopped_stack_holds_the_schedule_until_the_next_start_ends_it(tmp_path, monkeypatch):
    """`make dev` stopped while the sync run's process died mid-cycle; the next `make dev` runs the CLI first."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with DagsterInstance.get() as instance:
        left = add_run(instance, DagsterRunStatus.STARTED)
        started_in(instance, left, gone_pid())
        assert isinstance(tick(instance), SkipReason)  # an hour of no sync, before
    assert main(["end-runs-left-in-progress"]) == 0
    with DagsterInstance.get() as instance:
        assert status(instance, left) == DagsterRunStatus.FAILURE
        assert isinstance(tick(instance), RunRequest)  # the next tick starts a sync run


def test_stopping_waits_for_a_run_to_record_its_end_and_gives_up_after_the_timeout():
    with instance_for_test() as instance:
        run_id = add_run(instance, DagsterRunStatus.STARTED)
        # The sync run ends after its cycle, a moment after the stack was asked to stop.
        ender = threading.Timer(0.5, lambda: instance.report_run_failed(instance.get_run_by_id(run_id), "interrupted"))
        ender.start()
        try:
            assert wait_for_runs_to_end(instance, timeout_seconds=30, poll_seconds=0.05) == []
        finally:
            ender.cancel()
        hung = add_run(instance, DagsterRunStatus.STARTED)
        now = [0.0]
        waits = []

        def sleep(seconds):
            waits.append(seconds)
            now[0] += seconds

        still = wait_for_runs_to_end(instance, timeout_seconds=3, poll_seconds=1, clock=lambda: now[0], sleep=sleep)
        assert [run.run_id for run in still] == [hung] and sum(waits) == 3


def test_the_wait_command_exits_1_naming_the_runs_still_in_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert main(["wait-for-runs", "--timeout", "0"]) == 0
    with DagsterInstance.get() as instance:
        hung = add_run(instance, DagsterRunStatus.STARTED)
    assert main(["wait-for-runs", "--timeout", "0.2"]) == 1
    assert hung in capsys.readouterr().err
