"""Where a sync's Spark time goes, by statement: Spark's own event log (`spark.eventLog.enabled`), each stage's task
metrics summed to the SQL execution that ran it, and the executions grouped by what they ran (a MERGE, the tombstone
lookup, a compaction slice, a collect). `cost.py --spark-event-log DIR` writes the log; this reads it:

    .venv/bin/python -m ddb_athena_bench.stage_metrics .ddb_athena/bench/stage-events/<app-id> [--since EPOCH_SECONDS] \
        [--stages-of 'sql: WriteDelta']

A statement's wall time beyond its stages' is the driver's own: Iceberg's planning (manifests) and its commit.
"""

import argparse
import collections
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

SQL_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
SQL_END = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"
# Stage totals Spark keeps (internal.metrics.<name>): run and CPU time of the tasks, bytes read and shuffled.
METRICS = {
    "executorRunTime": "task_seconds",
    "executorCpuTime": "task_cpu_seconds",
    "input.bytesRead": "input_bytes",
    "input.recordsRead": "input_records",
    "shuffle.read.localBytesRead": "shuffle_read_bytes",
    "shuffle.read.remoteBytesRead": "shuffle_read_bytes",
    "shuffle.write.bytesWritten": "shuffle_write_bytes",
    "output.bytesWritten": "output_bytes",
    "diskBytesSpilled": "spilled_bytes",
}
SCALE = {"task_seconds": 1e-3, "task_cpu_seconds": 1e-9}


@dataclass
class Execution:
    kind: str
    started_ms: int
    ended_ms: int = 0
    stages: int = 0
    tasks: int = 0
    totals: collections.Counter = field(default_factory=collections.Counter)
    by_stage: list[collections.Counter] = field(default_factory=list)


def statement_kind(description: str, plan_root: str) -> str:
    """What an execution ran: the Python call site Spark records (`collect at cycle.py:312`; a statement run by
    `spark.sql` has none, its site is Java's) and the root of its physical plan (`WriteDelta` for a merge-on-read MERGE,
    `Execute CreateViewCommand`...), without the names and literals that differ from cycle to cycle."""
    action, _, site = description.partition(" at ")
    site = "" if site.startswith("NativeMethodAccessorImpl") else f" at {Path(site).name}"
    return f"{action}{site}: {plan_root}"


def read(path: Path) -> dict[int, Execution]:
    executions: dict[int, Execution] = {}
    stage_execution: dict[int, int] = {}
    root: dict[int, int] = {}
    with path.open() as events:
        for line in events:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the last line of a log still being written
                break
            kind = event["Event"]
            if kind == SQL_START:
                # A statement's own executions (a CTAS's insert, a procedure's rewrites) count in the statement's.
                root[event["executionId"]] = root.get(event.get("rootExecutionId", -1), event["executionId"])
                if root[event["executionId"]] == event["executionId"]:
                    plan_root = event.get("sparkPlanInfo", {}).get("nodeName", "")
                    executions[event["executionId"]] = Execution(statement_kind(event.get("description", ""), plan_root), event["time"])
            elif kind == SQL_END and event["executionId"] in executions:
                executions[event["executionId"]].ended_ms = event["time"]
            elif kind == "SparkListenerJobStart":
                execution_id = (event.get("Properties") or {}).get("spark.sql.execution.id")
                if execution_id is not None:
                    stage_execution.update({stage: root.get(int(execution_id), int(execution_id)) for stage in event["Stage IDs"]})
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                execution = executions.get(stage_execution.get(info["Stage ID"], -1))
                if execution is None:
                    continue
                execution.stages += 1
                execution.tasks += info["Number of Tasks"]
                stage = collections.Counter()
                for accumulable in info.get("Accumulables", []):
                    name = accumulable.get("Name", "").removeprefix("internal.metrics.")
                    if name in METRICS:
                        stage[METRICS[name]] += int(accumulable["Value"])
                execution.totals.update(stage)
                execution.by_stage.append(stage)
    return executions


def _ended_since(executions: dict[int, Execution], since_ms: int) -> list[Execution]:
    return [execution for execution in executions.values() if execution.started_ms >= since_ms and execution.ended_ms]


def _means(totals: collections.Counter, count: int) -> dict[str, float]:
    return {name: totals[name] * SCALE.get(name, 1) / count for name in sorted(set(METRICS.values()))}


def summary(executions: dict[int, Execution], since_ms: int = 0) -> list[dict]:
    """One row per kind of statement, in the executions begun since `since_ms`: counts, then per execution."""
    groups: dict[str, list[Execution]] = collections.defaultdict(list)
    for execution in _ended_since(executions, since_ms):
        groups[execution.kind].append(execution)
    rows = []
    for kind, members in groups.items():
        count = len(members)
        totals = sum((member.totals for member in members), collections.Counter())
        wall = sum(member.ended_ms - member.started_ms for member in members) / 1e3
        row = {"statement": kind, "executions": count, "wall_seconds": wall / count, "stages": sum(m.stages for m in members) / count}
        row["tasks"] = sum(member.tasks for member in members) / count
        rows.append(row | _means(totals, count))
    return sorted(rows, key=lambda row: -row["wall_seconds"] * row["executions"])


def stages_of(executions: dict[int, Execution], statement: str, since_ms: int = 0) -> list[dict]:
    """A statement's stages in the order they completed (its scan, its join, its write...), each the mean over the
    executions of that statement with the most common number of stages."""
    members = [execution for execution in _ended_since(executions, since_ms) if execution.kind == statement]
    if not members:
        return []
    usual = collections.Counter(len(member.by_stage) for member in members).most_common(1)[0][0]
    members = [member for member in members if len(member.by_stage) == usual]
    return [{"stage": index + 1} | _means(sum((m.by_stage[index] for m in members), collections.Counter()), len(members)) for index in range(usual)]


def _metrics_cells(row: dict) -> str:
    return (
        f"{row['task_seconds']:.2f} | {row['task_cpu_seconds']:.2f} | {row['input_bytes'] / 1e6:.1f} | {row['input_records']:,.0f} | "
        f"{row['shuffle_read_bytes'] / 1e6:.1f} | {row['shuffle_write_bytes'] / 1e6:.1f} | {row['spilled_bytes'] / 1e6:.1f} | {row['output_bytes'] / 1e6:.1f}"
    )


METRIC_HEADERS = "task s | task CPU s | input MB | records | shuffle read MB | shuffle write MB | spilled MB | output MB"


def table(rows: list[dict]) -> str:
    lines = [f"| statement | runs | wall s (each) | stages | tasks | {METRIC_HEADERS} |", "| --- |" + " ---: |" * 12]
    for row in rows:
        lines.append(
            f"| `{row['statement']}` | {row['executions']} | {row['wall_seconds']:.2f} | {row['stages']:.1f} | {row['tasks']:.0f} | {_metrics_cells(row)} |"
        )
    return "\n".join(lines)


def stage_table(rows: list[dict]) -> str:
    return "\n".join([f"| stage | {METRIC_HEADERS} |", "| ---: |" + " ---: |" * 8] + [f"| {row['stage']} | {_metrics_cells(row)} |" for row in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("event_log", type=Path, help="a Spark event log file (spark.eventLog.dir/<application id>)")
    parser.add_argument("--since", type=float, default=0.0, help="only executions begun from this time (epoch seconds)")
    parser.add_argument("--stages-of", help="a statement as the summary names it: its stages, one row each")
    arguments = parser.parse_args(argv)
    executions, since_ms = read(arguments.event_log), int(arguments.since * 1000)
    print(table(summary(executions, since_ms)))
    if arguments.stages_of:
        print(stage_table(stages_of(executions, arguments.stages_of, since_ms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
