"""The runs of a harness run, by what became of them, and the one outcome that is an anomaly: a live writer's run
failed, or its commits refused, by another writer.

A writer that a fault made stale (paused past its lease, a skewed clock) or whose own lease ran out unrenewed is fenced
by design. A writer fenced while it held a lease nobody had taken from it would be a stale writer winning."""

from collections import Counter
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus

from ddb_athena_faults.checker import Anomaly

LIVE_WRITER_FENCED = "live writer fenced by a stale one"
# What the project's errors say (lake/writer_branch.py, lib/writer_lease.py), as they reach the run's log.
_FENCED = ("commits are not published", "a newer writer", "was taken over by", "main kept moving")
# Its own lease ran out (not renewed in time, left to expire after a stall): from then on it is stale itself.
_EXPIRED = ("has not been renewed", "left to expire")


def classify_runs(dagster_home: Path, stale_runs: set[str], launched: dict[str, str]) -> tuple[dict[str, Counter], list[Anomaly]]:
    """Runs by job and status, and an anomaly for each run fenced before anything made it stale."""
    by_job: dict[str, Counter] = {}
    anomalies = []
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        for run in instance.get_runs():
            kind = launched.get(run.run_id, run.job_name)
            by_job.setdefault(kind, Counter())[run.status.value] += 1
            if run.run_id in stale_runs or run.status == DagsterRunStatus.QUEUED:
                continue
            for record in instance.all_logs(run.run_id):
                text = record.message or ""
                error = getattr(getattr(record.dagster_event, "event_specific_data", None), "error", None) if record.dagster_event else None
                text += f" {error.message}" if error is not None else ""
                if any(marker in text for marker in _EXPIRED):
                    break
                if any(marker in text for marker in _FENCED):
                    anomalies.append(Anomaly(LIVE_WRITER_FENCED, run.job_name, (run.run_id,), text.strip()[:300]))
                    break
    return by_job, anomalies
