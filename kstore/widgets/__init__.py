"""Widgets that show the engine's files and bytes as they change (JupyterLab, ipywidgets 8).

Every view is a plain-Python *model* (state + HTML, testable without a browser) and a *view*
(ipywidgets) that redraws when the model changes. Models read the engine's real files and state
and follow its `EventBus` — no polling.

    from kstore.widgets import HexView, DirectoryView, IndexView, LookupView
    HexView(log)                      # bytes of the active segment, coloured by Kafka field
    DirectoryView(log)                # segments, files, checkpoints of the partition
    IndexView(log)                    # the sparse offset index pointing into the log
    LookupView(log, 1234)             # the steps of finding offset 1234 (button: Step)
    CompactionView(log)               # before/after a retention or cleaning pass
    ReplicaView(cluster, "orders")    # replicas side by side, HW/LEO, produce/fetch/crash/elect
    ZeroCopyView(log)                 # read+send vs sendfile, measured here
    OffsetsView(broker)               # groups, committed offsets, lag, __consumer_offsets-N
    GroupView(broker, "billing")      # a consumer group's state, generation, members, partitions
    QuizView()                        # interview flashcards
    bulk_produce(log, 1_000_000)      # long operations show a progress bar
    watch_spark(spark)                # every later cell running Spark jobs: a bar of its tasks
    with working("starting Spark"): spark = spark_session()   # unknown length: seconds passing
    run_kstore("dump-log", path)      # a `kstore` command in a subprocess, under such a bar
"""

from .compaction import CompactionModel, CompactionView
from .directory import DirectoryModel, DirectoryView
from .fields import KINDS, Field, file_kind
from .hexview import HexModel, HexView
from .index_view import IndexModel, IndexView
from .lookup import LookupModel, LookupView, trace_offset, trace_timestamp
from .group import GroupModel, GroupView
from .offsets import OffsetsModel, OffsetsView
from .progress import (ProgressBar, ProgressModel, SparkTasksBar, Working, bulk_produce, run_kstore,
                       track, watch_spark, working)
from .quiz import DEFAULT_CARDS, Card, QuizModel, QuizView
from .replica import ReplicaModel, ReplicaView
from .zerocopy import ZeroCopyModel, ZeroCopyView, measure_transfer

__all__ = [
    "Card", "CompactionModel", "CompactionView", "DEFAULT_CARDS", "DirectoryModel",
    "DirectoryView", "Field", "HexModel", "HexView", "IndexModel", "IndexView", "KINDS",
    "GroupModel", "GroupView", "LookupModel", "LookupView", "OffsetsModel", "OffsetsView",
    "ProgressBar", "ProgressModel", "QuizModel", "QuizView", "ReplicaModel", "ReplicaView",
    "SparkTasksBar", "ZeroCopyModel", "ZeroCopyView", "bulk_produce", "file_kind", "measure_transfer",
    "trace_offset", "trace_timestamp", "track", "watch_spark", "Working", "working", "run_kstore",
]
