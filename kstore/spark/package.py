"""`kstore.zip`: kstore's code for Spark executors whose Python has no kstore installed.

Spark ships Python code to executors as zip files (`spark-submit --py-files kstore.zip`, the
`spark.submit.pyFiles` setting, or `SparkContext.addPyFile`); each Python worker puts them on its
`sys.path`. The zip holds the `kstore` package's Python sources (no notebooks, no caches) and the
`pyspark_kstore` module that lets Spark find the data source by name. Its third-party imports
(pyarrow, numpy, crc32c, the codecs) must be installed on the workers, as they must be for any
PySpark job that uses Arrow.

    kstore spark-package --output dist/kstore.zip
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile

import kstore

PACKAGE_DIR = os.path.dirname(os.path.abspath(kstore.__file__))
EXTRA_MODULES = ("pyspark_kstore.py",)
# A fixed timestamp: the same sources give the same bytes (and the same cached file name).
ZIP_TIME = (2020, 1, 1, 0, 0, 0)


def _sources() -> list[tuple[str, str]]:
    """(path on disk, name in the zip) of every file to ship, sorted."""
    out = []
    for root, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if name.endswith((".py", ".json", ".txt", ".css", ".js")):
                path = os.path.join(root, name)
                out.append((path, os.path.join("kstore", os.path.relpath(path, PACKAGE_DIR))))
    parent = os.path.dirname(PACKAGE_DIR)
    for name in EXTRA_MODULES:
        path = os.path.join(parent, name)
        if os.path.exists(path):
            out.append((path, name))
        else:   # an installed (non-editable) kstore: the module sits next to the package
            import importlib.util
            spec = importlib.util.find_spec(name[:-3])
            if spec is not None and spec.origin:
                out.append((spec.origin, name))
    return out


def write_package(output: str) -> str:
    """Write the zip to `output` (atomically); returns its absolute path."""
    output = os.path.abspath(output)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    partial = f"{output}.{os.getpid()}.tmp"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for path, name in _sources():
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            with open(path, "rb") as f:
                z.writestr(info, f.read())
    os.replace(partial, output)
    return output


def build_package(directory: str | None = None) -> str:
    """kstore.zip for the current sources, cached by content (a changed source, e.g. while a
    learner edits the engine, gives a new file, so executors never run stale code)."""
    digest = hashlib.sha256()
    for path, name in _sources():
        with open(path, "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    directory = directory or os.path.join(tempfile.gettempdir(), f"kstore-spark-{os.getuid()}")
    # Spark refuses to add two files of the same name, so the hash goes into the directory.
    path = os.path.join(directory, digest.hexdigest()[:16], "kstore.zip")
    if not os.path.exists(path):
        write_package(path)
    return path


def add_parser(sub) -> None:
    """`kstore spark-package [--output PATH]`."""
    p = sub.add_parser("spark-package", help="build kstore.zip for Spark executors "
                                             "(spark-submit --py-files kstore.zip)")
    p.add_argument("--output", "-o", default="kstore.zip", help="where to write the zip "
                                                                "(default ./kstore.zip)")
    p.set_defaults(func=_spark_package)


def _spark_package(args) -> int:
    path = write_package(args.output)
    print(f"{path} ({os.path.getsize(path):,} bytes): use it with spark-submit --py-files {path}, "
          f"or SparkSession.builder.config(\"spark.submit.pyFiles\", \"{path}\")")
    return 0
