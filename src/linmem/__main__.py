"""``python -m linmem`` runs the command line."""

from linmem._launch import main

main()
