"""``python -m linmem`` runs the command line."""

from linmem.cli.launch import main

__all__: list[str] = []

main()
