"""Spark finds this module by its name: when a SparkSession first uses a data source, Spark imports
every installed module named `pyspark_*` and registers its `DefaultSource` under the source's
name. So `spark.read.format("kstore")` works in any session, without a registration call."""

from kstore.spark.source import KStoreDataSource as DefaultSource  # noqa: F401
