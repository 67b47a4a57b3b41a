"""The ``linmem`` command's entry point: thread defaults first, then the command line.

The OpenMP settings of :mod:`linmem._threads` take effect only if they are in the environment
before torch loads, so this module imports nothing that imports torch before setting them.
``linmem``, ``linmem --help`` and ``linmem --version`` answer without loading torch at all.
"""

from __future__ import annotations

import sys
from importlib import metadata

from linmem._threads import configure_threads

__all__ = ["main"]


def _one_line_warnings() -> None:
    """linmem's own warnings on the command line: ``linmem: warning: ...``, one line, without
    the source line Python prints under a warning."""
    import warnings

    show = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if "linmem" in filename.replace("\\", "/").split("/") or str(message).startswith(
                "linmem:"):
            text = " ".join(str(message).removeprefix("linmem: ").split())
            print(f"linmem: warning: {text}", file=file or sys.stderr, flush=True)
        else:
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def main() -> None:
    args = sys.argv[1:]
    if args in ([], ["-h"], ["--help"]):
        from linmem.cli.usage import USAGE  # the text `linmem --help` prints (tested equal)

        sys.stdout.write(USAGE)
        return
    if args == ["--version"]:
        print(f"linmem, version {metadata.version('linear-memory-networks')}")
        return
    configure_threads()
    _one_line_warnings()
    from linmem.cli.commands import main as cli_main

    cli_main()
