"""The runs a stopped `make dev` can leave behind.

The default run launcher (a process per run) cannot tell run monitoring that a run's process is gone. A
books_sync run that died with the stack stayed STARTED, and held the writer tag and the minute schedule
until its max runtime (70 minutes) ran out: the next `make dev` synced nothing for an hour. So `make dev`,
when it stops, waits for its runs to record their end before it stops the emulator they write to (Ctrl-C
reaches the sync run too, which ends after its cycle), and, when it starts, ends the runs an earlier stack
left in progress whose process is gone. Deployed, a launcher that checks its workers (ECS, Kubernetes) and run
monitoring do this.
"""

import os
import time
from collections.abc import Callable

from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

IN_PROGRESS = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
LEFT_BEHIND = (
    "Ended by `make dev` at its start: the stack that ran this run stopped before the run recorded its end, "
    "and its process is gone. Re-execute it if it mattered; the books schedule starts a new sync run by itself."
)


def runs_in_progress(instance: DagsterInstance) -> list[DagsterRun]:
    return list(instance.get_runs(filters=RunsFilter(statuses=IN_PROGRESS)))


def wait_for_runs_to_end(
    instance: DagsterInstance,
    timeout_seconds: float,
    poll_seconds: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[DagsterRun]:
    """Waits until no run is in progress, at most `timeout_seconds`; returns the runs still in progress."""
    deadline = clock() + timeout_seconds
    while (running := runs_in_progress(instance)) and clock() < deadline:
        sleep(poll_seconds)
    return running


def worker_alive(instance: DagsterInstance, run: DagsterRun) -> bool:
    """Whether the process that started executing `run` still exists. A pid taken over by another process counts
    as alive: the run is then left as it is, which is what happened before this module."""
    records = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.RUN_START, limit=1).records
    pid = records[0].event_log_entry.dagster_event.pid if records else None
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_runs_left_in_progress(instance: DagsterInstance) -> tuple[list[DagsterRun], list[DagsterRun]]:
    """Marks the runs in progress whose process is gone as failed, with the reason; returns them and the runs left
    alone because their process is still there (another stack on the same instance, or a run still ending)."""
    ended, alive = [], []
    for run in runs_in_progress(instance):
        if worker_alive(instance, run):
            alive.append(run)
        else:
            instance.report_run_failed(run, LEFT_BEHIND)
            ended.append(run)
    return ended, alive


def limit_writer_pools(instance: DagsterInstance, pools: tuple[str, ...]) -> None:
    """One run at a time in each writers' pool, set in the instance before its daemon first meets the pools. The
    default limit of dagster.yaml takes effect only from the queue daemon's second pass over a new pool: in its first,
    a backfill's runs all started at once (seen on the real stack; the writer lease stopped the third)."""
    for pool in pools:
        instance.event_log_storage.set_concurrency_slots(pool, 1)
