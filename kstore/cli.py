"""The `kstore` command (also `python -m kstore`), modelled on Kafka's tools."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__
from .errors import KStoreError


def _dump_log(args: argparse.Namespace) -> int:
    from .dump_log import dump_file
    files = list(args.paths)
    for group in args.files or []:
        files.extend(f for f in group.split(",") if f)
    if not files:
        print("dump-log: give at least one file (positional or --files a,b)", file=sys.stderr)
        return 2
    for name in ("max_bytes", "max_message_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise KStoreError(f"--{name.replace('_', '-')} must be 1 or more, not {value}")
    ok = True
    for path in files:
        ok &= dump_file(path, print_data=args.print_data_log,
                        index_sanity_check=args.index_sanity_check,
                        deep_iteration=args.deep_iteration, offsets_decoder=args.offsets_decoder,
                        transaction_log_decoder=args.transaction_log_decoder,
                        skip_record_metadata=args.skip_record_metadata, max_bytes=args.max_bytes,
                        verify_index_only=args.verify_index_only)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kstore", description="kstore: a Kafka-format storage "
                                     "engine you build and inspect in JupyterLab")
    parser.add_argument("--version", action="version", version=f"kstore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    dump = sub.add_parser("dump-log", help="print .log/.index/.timeindex/.txnindex/.snapshot and checkpoint "
                          "files like kafka-dump-log.sh")
    dump.add_argument("paths", nargs="*", metavar="FILE")
    dump.add_argument("--files", action="append", help="comma-separated files (Kafka's spelling)")
    dump.add_argument("--print-data-log", action="store_true",
                      help="print each record's key and payload (implies --deep-iteration)")
    dump.add_argument("--deep-iteration", action="store_true", help="print every record")
    dump.add_argument("--offsets-decoder", action="store_true",
                      help="decode __consumer_offsets records (offset commits, group metadata) as JSON")
    dump.add_argument("--transaction-log-decoder", action="store_true",
                      help="decode __transaction_state records (transaction metadata) as JSON")
    dump.add_argument("--index-sanity-check", action="store_true",
                      help="only run the index sanity check Kafka runs at startup")
    dump.add_argument("--verify-index-only", action="store_true",
                      help="check an .index against its .log, printing only the mismatches")
    dump.add_argument("--skip-record-metadata", action="store_true",
                      help="print records without their offset, timestamp, sizes and headers")
    dump.add_argument("--max-bytes", type=int, metavar="SIZE",
                      help="read only the batches within the first SIZE bytes of each .log")
    dump.add_argument("--max-message-size", type=int, metavar="SIZE",
                      help="accepted for kafka-dump-log.sh's command lines; kstore reads each "
                           "batch whole whatever its size")
    dump.set_defaults(func=_dump_log)
    from .tools import add_parsers
    add_parsers(sub)
    from .grading.cli import add_parsers as add_grading_parsers
    add_grading_parsers(sub)
    from .spark.package import add_parser as add_spark_package_parser
    add_spark_package_parser(sub)
    return parser


# The tools that print the engine's warnings on stderr (`serve` logs them to stdout itself).
OPERATOR_TOOLS = ("dump-log", "topics", "produce", "consume", "get-offsets", "consumer-groups")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    warnings = None
    if args.command in OPERATOR_TOOLS:   # the engine's warnings (a damaged file skipped...), one line each
        warnings = logging.StreamHandler(sys.stderr)
        warnings.setLevel(logging.WARNING)
        logging.getLogger("kstore").addHandler(warnings)
    try:
        return args.func(args)
    except KStoreError as e:   # a clear one-line error, not a traceback
        print(f"kstore {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `kstore dump-log ... | head`
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:   # a file or directory the tool may not read or write: say which
        print(f"kstore {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if warnings is not None:
            logging.getLogger("kstore").removeHandler(warnings)


if __name__ == "__main__":
    sys.exit(main())
