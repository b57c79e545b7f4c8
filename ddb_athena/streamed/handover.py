"""The streamed tables' sync: its handover from one long-lived run to the next, without a gap in the tables' freshness.

One sync run at a time writes the streamed tables (a writer lease each). Sync runs are in none of the tables' writer
pools, so the next one starts while the running one still cycles: it starts its process and JVM (an ECS task takes
30-90 s), reads the tables once, says it is ready (READY_TAG), and waits for the leases. The running one ends after
its cycle when:
- a newer sync run is ready (it takes the leases within seconds);
- its planned time is up and no newer sync run is on its way (the schedule is off);
- another writer waits or runs for every table it syncs (a bootstrap, Materialize, maintenance: those are in their
  table's pool, and queue there). For some of its tables only, it gives those up and keeps the others.
A newer run on its way but not ready keeps it cycling, up to HANDOVER_GRACE_SECONDS past its planned end.

ECS stopping a sync run's task (Fargate Spot taking its capacity back: SIGTERM, then SIGKILL STOP_TIMEOUT_SECONDS
later) is a handover brought forward: the run tags itself INTERRUPTED_TAG and keeps cycling, the successor sensor
launches the next run at once, and the run ends when that one is ready, or in time to end before the kill.
"""

import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunRecord, RunsFilter

from ddb_athena.lib.declarations import declared_tables

# The one job that syncs every streamed table, and the schedule that starts it: named when books was the only one, and
# kept while books is declared, so that an existing instance keeps its runs' history and its schedule's cursor.
_SYNC_NAMED_AFTER = "books" if "books" in declared_tables() else "streamed"
SYNC_JOB_NAME = f"{_SYNC_NAMED_AFTER}_sync"
SYNC_SCHEDULE_NAME = f"{_SYNC_NAMED_AFTER}_every_minute"
# Set by a sync run once it is ready to take the lease.
READY_TAG = "ddb_athena/ready_to_sync"
# Run monitoring (dagster.yaml) ends a sync run still going this long after its planned end: it hangs.
SYNC_RUN_SLACK_MINUTES = 10
# How long a sync run keeps cycling past its planned end for a successor on its way (not hung: within the slack).
HANDOVER_GRACE_SECONDS = SYNC_RUN_SLACK_MINUTES * 60 / 2

# ECS sends SIGTERM, then SIGKILL this long after: Fargate's longest stopTimeout, which deploy/dagster_ecs.yaml sets on
# the container every run inherits; a Spot interruption's warning is as long.
STOP_TIMEOUT_SECONDS = 120
# What a sync run needs after its last cycle to give its leases up and end, before the kill.
EXIT_SECONDS = 20
# Set by a sync run whose task is being stopped under it; the successor sensor launches its successor.
INTERRUPTED_TAG = "ddb_athena/interrupted_at"

_ON_ITS_WAY = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def planned_end(record: RunRecord | None, run_minutes: float) -> float:
    """When a sync run plans to end: `run_minutes` after its start (not recorded yet: from now). The run ends there,
    and the schedule launches its successor before it."""
    started = record.start_time if record and record.start_time else time.time()
    return started + run_minutes * 60


def waiting_writers(instance: DagsterInstance, other_than: str | None = None) -> dict[str, DagsterRun]:
    """By writer pool, a queued or running writer other than a sync run (a bootstrap, Materialize, maintenance) and
    other than run `other_than`: the sync gives its table up to it after its cycle, and takes it back after."""
    found: dict[str, DagsterRun] = {}
    for run in instance.get_runs(filters=RunsFilter(statuses=_ON_ITS_WAY), limit=100):
        pools = (run.run_op_concurrency.all_pools or set()) if run.run_op_concurrency else set()
        # A sync run started by an earlier version of this code is in a pool: it is a sync, not a writer to wait for.
        if run.run_id != other_than and run.job_name != SYNC_JOB_NAME:
            for pool in pools:
                found.setdefault(pool, run)
    return found


@dataclass(frozen=True)
class SyncHandover:
    """What sync run `run` asks the instance at the start of each cycle."""

    instance: DagsterInstance
    run: DagsterRun

    def announce_ready(self) -> None:
        self.instance.add_run_tags(self.run.run_id, {READY_TAG: "true"})

    def rides_out(self, number: int) -> bool:
        """A SIGTERM while the run is not canceling is ECS stopping its task (a Spot interruption, a task replaced):
        the run tags itself to have its successor launched at once, and rides it out. SIGINT (Ctrl-C), and a Terminate
        (the run is CANCELING before its launcher signals it), stop it after its cycle."""
        run = self.instance.get_run_by_id(self.run.run_id)
        if number != signal.SIGTERM or run is None or run.status != DagsterRunStatus.STARTED:
            return False
        self.instance.add_run_tags(self.run.run_id, {INTERRUPTED_TAG: datetime.now(UTC).isoformat(timespec="seconds")})
        return True

    def newer_syncs(self) -> list[DagsterRun]:
        """The sync runs on their way or running that started after this one (or have not started yet)."""
        records = self.instance.get_run_records(filters=RunsFilter(job_name=SYNC_JOB_NAME, statuses=_ON_ITS_WAY), limit=10)
        started = {record.dagster_run.run_id: record.start_time for record in records}
        own = started.get(self.run.run_id)
        return [
            record.dagster_run
            for record in records
            if record.dagster_run.run_id != self.run.run_id and (record.start_time is None or own is None or record.start_time > own)
        ]

    def end_reason(self, time_is_up: bool) -> str | None:
        """Why this run ends after the cycle about to start, or None while it keeps its tables (a table another writer
        waits for is given up by the cycle itself: assets.sync_cycles)."""
        newer = self.newer_syncs()
        ready = [run for run in newer if run.status == DagsterRunStatus.STARTED and run.tags.get(READY_TAG) == "true"]
        if ready:
            return f"the next sync run {ready[0].run_id} is ready and takes over"
        if time_is_up and not newer:
            return "its time is up and no sync run is on its way to take over"
        return None
