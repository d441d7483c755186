"""The opreg command line: ``python3 -m opreg info | check | demo | cmake-dir | example-source``."""

from __future__ import annotations

import argparse
import os
import sys

import opreg
from opreg import _demo, _info, _opcheck


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opreg", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="each opreg op and what serves it on each device type")
    info.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="LIBRARY",
        help="load a C++ op library first (repeatable)",
    )
    info.add_argument("--examples", action="store_true", help="load the example op libraries")
    commands.add_parser("demo", help="define-by-C++ example op, called on each available device")
    commands.add_parser("cmake-dir", help="the folder to add to CMAKE_PREFIX_PATH")
    example = commands.add_parser(
        "example-source", help="the folder of an example's sources, to copy (e.g. scale_add)"
    )
    example.add_argument("name", nargs="?", default="scale_add")
    check = commands.add_parser("check", help="opreg.opcheck on every op (or those named)")
    check.add_argument("ops", nargs="*", help="qualified names, e.g. opreg::fused_add")
    check.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="LIBRARY",
        help="load a C++ op library first (repeatable)",
    )
    args = parser.parse_args(argv)

    if args.command in ("info", "check"):
        libraries = list(args.load)
        try:
            if getattr(args, "examples", False):
                libraries.append(opreg.example_library())
            for library in libraries:
                opreg.load_library(library)
        except (OSError, RuntimeError, ValueError) as error:  # missing, bad, failed definitions
            # The whole message: a library's lists each failing op and why on lines of its own.
            message = str(error).strip() or repr(error)
            print(f"python -m opreg {args.command}: {message}", file=sys.stderr)
            return 2
    if args.command == "info":
        print(_info.format_info())
    elif args.command == "demo":
        print(_demo.run())
    elif args.command == "cmake-dir":
        print(opreg.cmake_dir())
    elif args.command == "example-source":
        try:
            print(opreg.example_source(args.name))
        except ValueError as error:
            print(f"python -m opreg example-source: {error}", file=sys.stderr)
            return 2
    elif args.command == "check":
        return _opcheck.main(args.ops)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader went away (`python -m opreg info | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor one at exit's flush
        sys.exit(1)
    except OSError as error:  # the output cannot be written (a full disk, /dev/full)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"python -m opreg: cannot write the output: {error}", file=sys.stderr)
        sys.exit(1)
