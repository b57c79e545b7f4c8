"""Creating the SparkSession leaves the process's Ctrl-C handling alone (PySpark would put its own in place)."""

import subprocess
import sys
import textwrap

import pytest

# In a process of its own: one SparkContext per process, and this one must be created inside the hold.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from ddb_athena.lib.resources import IcebergSparkResource
    from ddb_athena.streamed.run_loop import StopRequest

    stop = StopRequest()
    spark = IcebergSparkResource(profile="local", warehouse="file://" + sys.argv[1])
    with stop.held():
        session = spark.spark_session  # as in a sync run's first cycle
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        print("count", session.range(10).count(), "stop held", stop.requested)
    """
)


@pytest.mark.subprocess
def test_ctrl_c_after_the_session_is_created_in_a_sync_cycle_is_held_for_the_loop_not_taken_by_pyspark(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "count 10 stop held True" in done.stdout
