"""``python -m linmem`` runs the command line."""

from .cli import main

main()
