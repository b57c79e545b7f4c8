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


def test_two_threads_under_the_same_settings_keep_them_until_the_last_is_done(spark):
    """Tables merged side by side in one session: the first merge to end must not take the settings from the other."""
    import threading

    spark.conf.set("spark.sql.shuffle.partitions", "4")
    settings = {"spark.sql.shuffle.partitions": "1"}
    inside, first_done, seen = threading.Event(), threading.Event(), []

    def second() -> None:
        with session_settings(spark, settings):
            inside.set()
            first_done.wait(30)
            seen.append(spark.conf.get("spark.sql.shuffle.partitions"))

    other = threading.Thread(target=second)
    with session_settings(spark, settings):
        other.start()
        inside.wait(30)
    first_done.set()
    other.join(30)
    assert seen == ["1"] and spark.conf.get("spark.sql.shuffle.partitions") == "4"
