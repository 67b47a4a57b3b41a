"""The ``linmem`` command: :mod:`linmem.cli.launch` (the entry point, torch not loaded for
``--help``), :mod:`linmem.cli.commands`, :mod:`linmem.cli.experiments` and
:mod:`linmem.cli.searches` (each command parses its options, makes one library call and
prints), :mod:`linmem.cli.common` (shared options)."""

__all__: list[str] = []
