"""The session answers PySpark's short-name class lookups itself; each one py4j answers costs a class-path search."""

from pyspark.sql import functions as F

from ddb_athena.lake.class_lookups import SHORT_NAMES

LOOKUP_COMMAND = "r\nu\n"


def commands_sent(spark, action) -> list[str]:
    client = spark.sparkContext._gateway._gateway_client
    sent, original = [], client.send_command

    def recorded(command, *args, **kwargs):
        sent.append(command)
        return original(command, *args, **kwargs)

    client.send_command = recorded
    try:
        action()
    finally:
        client.send_command = original
    return sent


def test_building_columns_asks_the_jvm_for_no_class(spark):
    sent = commands_sent(spark, lambda: spark.range(3).select(F.col("id"), F.expr("id + 1"), F.lit("x")).collect())

    assert [command for command in sent if command.startswith(LOOKUP_COMMAND)] == []


def test_a_name_not_kept_is_still_asked(spark):
    # The recording sees lookups: without the kept names, the test above would fail.
    sent = commands_sent(spark, lambda: spark.sparkContext._jvm.Column)

    assert [command.split("\n")[2] for command in sent if command.startswith(LOOKUP_COMMAND)] == ["Column"]


def test_the_kept_classes_are_the_ones_pyspark_means(spark):
    kept = {name: vars(spark.sparkContext._jvm)[name]._fqn for name in SHORT_NAMES}

    assert kept["functions"] == "org.apache.spark.sql.functions"
    assert kept["PythonUtils"] == "org.apache.spark.api.python.PythonUtils"
    assert kept["SparkSession"] == "org.apache.spark.sql.SparkSession"
