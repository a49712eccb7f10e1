"""kstore: a Kafka-format storage engine, built chapter by chapter in a JupyterLab course.

The engine writes the same files Kafka writes (RecordBatch v2 segments, sparse offset and time
indexes, checkpoint files) and reads what a real Kafka broker wrote.

    from kstore import Log, LogConfig, ManualClock
    log = Log.open("/tmp/demo/orders-0", LogConfig(segment_bytes=1024), ManualClock())
    log.append([("key", "value")])
"""

__version__ = "0.1.0"

from .clock import ManualClock, SystemClock  # noqa: E402
from .compression import Compression  # noqa: E402
from .config import LogConfig  # noqa: E402
from .errors import *  # noqa: E402,F401,F403
from .events import Event, EventBus, EventRecorder  # noqa: E402
from .log import Isolation, Log, LogAppendInfo  # noqa: E402
from .log_manager import LogManager  # noqa: E402
from .records import MemoryRecords, Record, RecordBatch, build_batch  # noqa: E402

__all__ = ["Compression", "Event", "EventBus", "EventRecorder", "Isolation", "Log",
           "LogAppendInfo", "LogConfig", "LogManager", "ManualClock", "MemoryRecords", "Record",
           "RecordBatch", "SystemClock", "build_batch", "use_my_engine"]


def __getattr__(name: str):
    if name == "use_my_engine":          # imported on first use: it loads the grading's plugs
        from .my_engine import use_my_engine
        return use_my_engine
    raise AttributeError(f"module 'kstore' has no attribute {name!r}")
