"""A step's runtime SQL settings apply to its queries only; the session gets its own back, even when the step fails."""

import pytest

from ddb_athena.lake.plan_settings import session_settings

UNSET = "spark.ddb_athena.test.unset"


def test_settings_apply_inside_and_the_sessions_own_come_back_after_a_failure(spark):
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    with pytest.raises(RuntimeError, match="step failed"), session_settings(spark, {"spark.sql.shuffle.partitions": "1", UNSET: "x"}):
        assert (spark.conf.get("spark.sql.shuffle.partitions"), spark.conf.get(UNSET)) == ("1", "x")
        raise RuntimeError("step failed")
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
    assert spark.conf.get(UNSET, None) is None  # unset again, not left at the step's value
