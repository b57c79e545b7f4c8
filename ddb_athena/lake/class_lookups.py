"""Keeps the JVM classes PySpark looks up by short name on the session's JVM view (Spark only, no Dagster).

PySpark asks py4j for some classes by short name on every call: `functions` for every `F.col` or `F.expr`,
`PythonUtils` for every list of columns. py4j answers each ask by trying the bare name and then every
package PySpark imported, in order, and each miss searches the whole class path (~250 JARs locally). That
was ~0.5 ms of JVM CPU per lookup, ~100 lookups per sync cycle, and ~7% of a warm cycle's CPU (interleaved A/B in one
session, docs/performance-log.md "Python's calls into the JVM"). A class found once stays the same class, so keeping it as an
attribute of the view (which py4j only asks the JVM about for names it does not have) changes nothing else.
"""

from pyspark.sql import SparkSession

SHORT_NAMES = ("functions", "PythonUtils", "PythonSQLUtils", "SparkSession", "SimplePythonFunction", "PythonRDD", "SerDeUtil")


def keep_class_lookups(spark: SparkSession) -> None:
    """Resolves the short names once, through py4j as PySpark would, and keeps them on the session's JVM view."""
    jvm = spark.sparkContext._jvm
    for name in SHORT_NAMES:
        if name not in vars(jvm):
            setattr(jvm, name, getattr(jvm, name))
