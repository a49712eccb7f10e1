"""A Spark driver for tests/test_spark.py's killed-commit test: one streaming query copying the
keyless topic `src` into `out` in the same log directory, no broker running (the staged sink:
tasks stage batches, the driver's commit appends them), with a checkpoint.

    python spark_staged_commit_job.py LOG_DIR CHECKPOINT MAX_OFFSETS_PER_TRIGGER

The test kills this driver (SIGKILL, its process group) while a commit is under way, then runs
it again: the restarted query re-runs that micro-batch and resumes the commit."""

from __future__ import annotations

import sys

log_dir, checkpoint, per_trigger = sys.argv[1:4]

from kstore.spark import spark_session  # noqa: E402

spark = spark_session("staged-commit")
stream = spark.readStream.format("kstore").option("subscribe", "src") \
    .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", per_trigger).load(log_dir)
query = stream.select("value").writeStream.format("kstore").option("topic", "out") \
    .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(log_dir)
query.awaitTermination()
print("done", flush=True)
spark.stop()
