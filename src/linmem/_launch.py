"""The ``linmem`` command's entry point: thread defaults first, then the command line.

The OpenMP settings of :mod:`linmem._threads` take effect only if they are in the environment
before torch loads, so this module imports nothing that imports torch before setting them.
"""

from __future__ import annotations

from linmem._threads import configure_threads

__all__ = ["main"]


def main() -> None:
    configure_threads()
    from linmem.cli import main as cli_main

    cli_main()
