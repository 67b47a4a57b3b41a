"""Sphinx configuration of linmem's user guide and API reference (``make docs``)."""

from importlib import metadata

project = "linmem"
author = "linmem developers"
release = metadata.version("linear-memory-networks")
copyright = "2026, linmem developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.doctest", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_heading_anchors = 3
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
exclude_patterns = ["_build"]
html_theme = "alabaster"


def _skip_class_aliases(app, what, name, obj, skip, options):
    """A dataclass field whose default is a class (``ModelSpec.options``) is documented by its
    docstring's ``Attributes:`` (napoleon); autodoc would add it again as "alias of" that class."""
    if what == "class" and isinstance(obj, type) and obj.__name__ != name:
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_class_aliases)
