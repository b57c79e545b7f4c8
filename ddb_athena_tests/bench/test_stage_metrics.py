"""The stage-metrics reader on an event log Spark 3.5 wrote (its SQL, job and stage events, kept as written but for
the long plan texts): a probe that collected a GROUP BY over 100,000 rows, then ran a CREATE TABLE AS SELECT."""

from pathlib import Path

from ddb_athena_bench.stage_metrics import read, stages_of, summary

EVENT_LOG = Path(__file__).with_name("spark_event_log.jsonl")


def test_each_statements_stages_are_summed_to_it_its_own_executions_included():
    rows = {row["statement"]: row for row in summary(read(EVENT_LOG))}
    assert set(rows) == {
        "createOrReplaceTempView: Execute CreateViewCommand",
        "collect at evprobe.py:6: AdaptiveSparkPlan",
        "sql: Execute CreateDataSourceTableAsSelectCommand",
    }
    # The CTAS's insert is an execution of its own in the log (rootExecutionId: the CTAS): its stage counts in the CTAS.
    create = rows["sql: Execute CreateDataSourceTableAsSelectCommand"]
    assert create["executions"] == 1 and create["stages"] == 1 and create["input_records"] == 100_000 and create["output_bytes"] > 0
    assert 0 < create["task_cpu_seconds"] <= create["task_seconds"] <= create["wall_seconds"]
    assert rows["collect at evprobe.py:6: AdaptiveSparkPlan"]["input_records"] == 100_000
    assert rows["createOrReplaceTempView: Execute CreateViewCommand"]["stages"] == 0


def test_only_the_executions_begun_in_the_window_are_counted():
    executions = read(EVENT_LOG)
    last = max(execution.started_ms for execution in executions.values())
    assert [row["statement"] for row in summary(executions, since_ms=last)] == ["sql: Execute CreateDataSourceTableAsSelectCommand"]


def test_a_statements_stages_are_listed_in_order_with_their_own_metrics():
    (stage,) = stages_of(read(EVENT_LOG), "sql: Execute CreateDataSourceTableAsSelectCommand")
    assert stage["stage"] == 1 and stage["input_records"] == 100_000 and stage["output_bytes"] > 0
    assert stages_of(read(EVENT_LOG), "no such statement") == []
