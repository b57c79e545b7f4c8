"""Whether this Dagster instance makes a table's writers wait for each other: one run at a time in each writers' pool.

Every writer of a table is in that table's pool (writer_lease.py). Without a queue that admits one run of the pool at a
time, a writer launched beside a running one (a bootstrap beside the sync) starts at once instead of waiting QUEUED,
and the running sync, which gives way only to a queued writer (streamed/handover.py, waiting_writers), keeps the table
until its run ends: the newcomer waits for the writer lease and fails once it has waited twice its time to live (with
op granularity, its step waits for the pool's slot instead, up to the sync's hour). Nothing is written twice
(the lease and the branch fence keep one writer), so a writer run warns and goes on; `ddb-athena writer-pools` sets
the limits and exits 1 naming what dagster.yaml still lacks.
"""

from dagster import DagsterInstance, QueuedRunCoordinator
from dagster._core.instance.config import PoolGranularity

WRITER_POOLS_COMMAND = "ddb-athena writer-pools"
# What dagster.yaml needs, as in this repository's.
POOLS_SETTING = "concurrency: pools: {granularity: run, default_limit: 1}"


def pool_limit(instance: DagsterInstance, pool: str) -> int | None:
    """How many runs of `pool` the queue admits at once: the limit set in the instance (`ddb-athena writer-pools`,
    `dagster instance concurrency set`), else dagster.yaml's default_limit; None when neither is set."""
    limits = {limit.name: limit.limit for limit in instance.event_log_storage.get_pool_limits()}
    if pool in limits:
        return limits[pool]
    return instance.event_log_storage.get_pool_config().default_pool_limit


def writer_pool_problems(instance: DagsterInstance, pool: str) -> tuple[list[str], list[str]]:
    """What keeps the runs of `pool` from waiting in the queue one at a time: (problems dagster.yaml must fix, problems
    `ddb-athena writer-pools` fixes). Both empty when they do wait."""
    in_settings, in_limits = [], []
    if not isinstance(instance.run_coordinator, QueuedRunCoordinator):
        in_settings.append(
            f"the instance starts every run at once (its run coordinator is {type(instance.run_coordinator).__name__}, not QueuedRunCoordinator)"
        )
    granularity = instance.event_log_storage.get_pool_config().pool_granularity
    if granularity != PoolGranularity.RUN:
        # With op granularity the run starts and its step waits for a slot inside it: it is never seen QUEUED.
        in_settings.append(f"pools limit ops, not runs (granularity {granularity.value if granularity else 'not set'}, not run)")
    limit = pool_limit(instance, pool)
    if limit is None:
        in_limits.append(f"pool {pool} has no limit")
    elif limit != 1:
        in_limits.append(f"pool {pool} admits {limit} runs at once, not 1")
    return in_settings, in_limits


def writer_pool_warning(instance: DagsterInstance, pool: str) -> str | None:
    """A writer run's warning when its pool does not admit one run at a time, naming what to set and run; None when it does."""
    in_settings, in_limits = writer_pool_problems(instance, pool)
    if not in_settings and not in_limits:
        return None
    fixes = []
    if in_settings:
        fixes.append(f"set `{POOLS_SETTING}` in the instance's dagster.yaml (and its run coordinator, if set, to QueuedRunCoordinator), restart its daemon")
    fixes.append(f"run `{WRITER_POOLS_COMMAND}` (`.venv/bin/{WRITER_POOLS_COMMAND}` in this repository) with the instance's DAGSTER_HOME")
    return (
        f"Writers of pool {pool} do not wait for each other in this Dagster instance: {'; '.join(in_settings + in_limits)}. "
        "Another writer of the table (a bootstrap, Materialize, a backfill, maintenance) then starts instead of waiting in the "
        "queue, and waits for the running writer or fails on the writer lease: a books sync gives way only to a queued "
        f"writer, and otherwise keeps the table until its run ends. To fix: {', then '.join(fixes)}."
    )


def warn_unless_writers_queue(context, pool: str) -> None:
    """At the start of a writer run (its op or asset `context`): writer_pool_warning in the run's log, if any. A warning,
    not a failure: the lease keeps one writer whatever the pools, and failing would stop the sync along with the rest."""
    warning = writer_pool_warning(context.instance, pool)
    if warning is not None:
        context.log.warning(warning)
