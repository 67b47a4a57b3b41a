"""Sphinx configuration of linmem's API reference (``make docs``)."""

from importlib import metadata

project = "linmem"
author = "linmem developers"
release = metadata.version("linear-memory-networks")
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.doctest"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
exclude_patterns = ["_build"]
html_theme = "alabaster"
