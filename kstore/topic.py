"""Topic names, validated as Kafka's `Topic.validate` does, so no name can escape the log dir.

Legal: 1–249 characters from [a-zA-Z0-9._-], and not "." or "..". (249 leaves room for the
partition suffix and the `-delete` marker within the 255-character file name limit.)
"""

from __future__ import annotations

import re

from .errors import InvalidTopicError

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")


def validate_topic_name(topic: str) -> str:
    if not isinstance(topic, str):
        raise InvalidTopicError(f"topic name must be a string, not {type(topic).__name__}")
    if not topic:
        raise InvalidTopicError("topic name is illegal, it can't be empty")
    if topic in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {topic!r}")
    if len(topic) > MAX_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters, "
            f"topic name: {topic[:40]}... ({len(topic)} characters)")
    if not _LEGAL.match(topic):
        bad = sorted({c for c in topic if not re.match(r"[a-zA-Z0-9._-]", c)})
        raise InvalidTopicError(
            f"topic name {topic!r} is illegal, it contains a character other than ASCII "
            f"alphanumerics, '.', '_' and '-' (found {''.join(bad)!r})")
    return topic


def partition_dir_name(topic: str, partition: int) -> str:
    validate_topic_name(topic)
    if not isinstance(partition, int) or partition < 0:
        raise InvalidTopicError(f"invalid partition {partition!r} for topic {topic}")
    return f"{topic}-{partition}"
