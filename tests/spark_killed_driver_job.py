"""A Spark driver for tests/test_spark.py's killed-driver test: one streaming query copying topic
`big` into `out` through `kstore serve`, with a checkpoint.

    python spark_killed_driver_job.py SERVERS CHECKPOINT FLAG_DIR block|run

`block`: the task of partition 1 stops at its record 1400 (after writing FLAG_DIR/reached) and
waits there, so the test can kill this driver (SIGKILL, no cleanup of any kind) while the task of
partition 0 has produced its rows inside a transaction nobody commits. `run`: the same query,
restarted from the checkpoint, runs to the end (Trigger.AvailableNow)."""

from __future__ import annotations

import os
import sys
import time

servers, checkpoint, flag_dir, mode = sys.argv[1:5]


def hold(value):
    if mode == "block" and value == b"1:1400":
        open(os.path.join(flag_dir, "reached"), "w").close()
        deadline = time.monotonic() + 120        # bounded: this worker outlives the killed JVM
        while not os.path.exists(os.path.join(flag_dir, "go")) and time.monotonic() < deadline:
            time.sleep(0.05)
    return value


from kstore.spark import spark_session  # noqa: E402
from pyspark.sql.functions import col, udf  # noqa: E402

spark = spark_session("killed-driver")
stream = spark.readStream.format("kstore").option("kafka.bootstrap.servers", servers) \
    .option("subscribe", "big").option("startingOffsets", "earliest").load()
query = stream.select(udf(hold, "binary")(col("value")).alias("value")).writeStream \
    .format("kstore").option("kafka.bootstrap.servers", servers).option("topic", "out") \
    .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
query.awaitTermination()
print("done", flush=True)
spark.stop()
