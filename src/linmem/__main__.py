"""``python -m linmem`` runs the command line."""

from linmem._launch import main

__all__: list[str] = []

main()
