"""The package's structure, as a newcomer meets it: how many modules each package holds, the
longest functions and modules (against the limits that ``tests/test_architecture.py`` sets), and
what ``from linmem import LMN`` costs beyond ``import torch``, the names a module re-exports
(imported from their owner and imported again from it by others, or listed in its ``__all__``;
the packages' ``__init__`` aside), and, given a virtual environment holding a bare install, its
packages and size.

The source tree and the interpreter are arguments, so that a tree at another commit (a worktree
of an older layout, with its own virtual environment) is measured by the same script:

    python benchmarks/structure.py --json results/structure/after.json
    python benchmarks/structure.py --src ../old/src/linmem --python ../old/.venv/bin/python \\
        --json results/structure/before.json

The import times are the median of ``--repeat`` fresh interpreters, each timing ``import torch``
and then ``from linmem import LMN`` (so the second figure is what linmem adds), and saying
whether ``torch._dynamo`` was loaded by then. Time them on an idle machine.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from linmem._io import command_line, git_commit, machine, provenance, write_json

FUNCTION_LINES = 80  # the limits tests/test_architecture.py holds
MODULE_LINES = 600

_IMPORT = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from linmem import LMN
t2 = time.perf_counter()
print(json.dumps({"torch_s": t1 - t0, "linmem_s": t2 - t1,
                  "dynamo": "torch._dynamo" in sys.modules,
                  "modules": sorted(m for m in sys.modules if m.startswith("linmem"))}))
"""


def _functions(node: ast.AST, prefix: str):
    """``(dotted name, lines)`` of every function under ``node``, methods and nested ones too."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, name + ".")


def units(src: Path) -> dict:
    """Every module under ``src`` (a ``linmem`` package folder) with its package, its lines and
    its functions' lines (methods and nested functions included, by their dotted names)."""
    modules = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = ".".join(rel.parts[:-1])
        text = path.read_text()
        functions = list(_functions(ast.parse(text), ""))
        modules.append({"module": name, "package": package, "lines": len(text.splitlines()),
                        "functions": functions})
    return {"modules": modules}


def _top_names(body: list[ast.stmt], defined: set[str], imported: dict[str, str]) -> None:
    """The names a module's top level defines and those it imports (name -> the module it is
    imported from), under ``if`` and ``try`` too."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            imported.update({a.asname or a.name: node.module or "" for a in node.names})
        elif isinstance(node, ast.Import):
            imported.update({(a.asname or a.name).split(".")[0]: a.name for a in node.names})
        elif isinstance(node, (ast.If, ast.Try)):
            for part in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", [])),
                         getattr(node, "finalbody", [])):
                _top_names(part, defined, imported)


def _module_of(path: Path, src: Path) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _uses(path: Path, src: Path, modules: set[str]) -> set[tuple[str, str]]:
    """``(module, name)`` for each ``from linmem.MODULE import name`` (absolute or relative)
    and each ``module_alias.name`` of a module imported as a name, in the file ``path``."""
    tree, alias, uses = ast.parse(path.read_text()), {}, set()
    inside = src in path.parents
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level and inside:
                base = _module_of(path, src).split(".")
                base = base if path.name == "__init__.py" else base[:-1]
                kept = base[:len(base) - node.level + 1]
                module = ".".join([*kept, node.module or ""]).strip(".")
            elif not node.level and (node.module or "").split(".")[0] == src.name:
                module = node.module
            else:
                continue
            for a in node.names:
                if f"{module}.{a.name}" in modules:
                    alias[a.asname or a.name] = f"{module}.{a.name}"
                else:
                    uses.add((module, a.name))
        elif isinstance(node, ast.Import):
            alias.update({a.asname: a.name for a in node.names
                          if a.asname and a.name.split(".")[0] == src.name})
    patched = {(alias[n.value.id], n.attr) for n in ast.walk(tree)  # ``alias.name = ...``
               if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
               and isinstance(n.value, ast.Name) and n.value.id in alias}
    patched |= {(alias[n.args[0].id], n.args[1].value) for n in ast.walk(tree)  # monkeypatch
                if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "setattr"
                and len(n.args) > 1 and isinstance(n.args[0], ast.Name)
                and n.args[0].id in alias and isinstance(n.args[1], ast.Constant)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in alias):
            uses.add((alias[node.value.id], node.attr))
    return uses - patched  # a name patched where it is used: the use site, not a copy


def reexports(src: Path, also: tuple[Path, ...] = ()) -> list[dict]:
    """The names a module of ``src`` re-exports: imported there from another module, and
    imported from it (by a module of ``src`` or a file under the folders ``also``) or listed in
    its ``__all__``. Packages' ``__init__`` files, whose re-exports are their public API, aside.
    Each with the module it is imported from there, and who imports it through the copy."""
    paths = {_module_of(p, src): p for p in sorted(src.rglob("*.py"))}
    names = {}
    for module, path in paths.items():
        defined, imported = set(), {}
        tree = ast.parse(path.read_text())
        _top_names(tree.body, defined, imported)
        listed = [c.value for n in tree.body if isinstance(n, ast.Assign)
                  and any(getattr(t, "id", "") == "__all__" for t in n.targets)
                  for c in ast.walk(n.value) if isinstance(c, ast.Constant)]
        names[module] = ({k: v for k, v in imported.items() if k not in defined}, set(listed))
    users: dict[tuple[str, str], set[str]] = {}
    files = [*paths.values(), *(f for root in also for f in sorted(root.rglob("*.py")))]
    for path in files:
        for use in _uses(path, src, set(paths)):
            users.setdefault(use, set()).add(str(path))
    found = []
    for module, (imported, listed) in names.items():
        if paths[module].name == "__init__.py":
            continue
        for name, origin in sorted(imported.items()):
            by = users.get((module, name), set()) | ({"__all__"} if name in listed else set())
            if by and f"{module}.{name}" not in paths:
                found.append({"module": module, "name": name, "from": origin,
                              "used_through_copy_by": sorted(by)})
    return found


def import_cost(python: str, repeat: int) -> dict:
    """The median seconds of ``import torch`` and then of ``from linmem import LMN`` over
    ``repeat`` fresh ``python`` processes, and whether ``torch._dynamo`` was loaded."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run([python, "-c", _IMPORT], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    return {"torch_s": statistics.median(r["torch_s"] for r in runs),
            "linmem_s": statistics.median(r["linmem_s"] for r in runs),
            "dynamo_loaded": any(r["dynamo"] for r in runs),
            "linmem_modules_loaded": len(runs[-1]["modules"]), "repeat": repeat}


def install_size(venv: Path) -> dict:
    """The packages of the virtual environment ``venv`` (a bare install of the wheel: ``pip
    install torch==2.13.0`` and then the wheel, as ``.ci/wheel-check`` makes it) and the size of
    its site-packages, with whether the extras' packages are there."""
    python = str(venv / "bin" / "python")
    listed = json.loads(subprocess.run([python, "-m", "pip", "list", "--format=json"],
                                       capture_output=True, text=True, check=True).stdout)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    size = sum(f.stat().st_size for f in Path(site.stdout.strip()).rglob("*") if f.is_file())
    names = sorted(p["name"].lower() for p in listed)
    return {"packages": len(names), "site_packages_mb": round(size / 2**20, 1),
            "extras_present": [n for n in ("optuna", "sqlalchemy", "alembic", "pretty-midi",
                                           "pretty_midi", "matplotlib") if n in names],
            "names": names}


def summary(tree: dict, top: int) -> dict:
    """The figures the issue asks for, from :func:`units`'s tree."""
    modules = tree["modules"]
    functions = sorted(((f"{m['module']}.{name}", n) for m in modules
                        for name, n in m["functions"]), key=lambda f: -f[1])
    return {
        "modules_per_package": dict(sorted(Counter(m["package"] for m in modules).items())),
        "modules": len(modules),
        "functions_over_limit": [f for f in functions if f[1] > FUNCTION_LINES],
        "modules_over_limit": sorted(((m["module"], m["lines"]) for m in modules
                                      if m["lines"] > MODULE_LINES), key=lambda m: -m[1]),
        "longest_functions": functions[:top],
        "longest_modules": sorted(((m["module"], m["lines"]) for m in modules),
                                  key=lambda m: -m[1])[:top],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=Path(__file__).parents[1] / "src" / "linmem",
                        help="the linmem package folder to read (default: this checkout's)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose linmem is imported (default: this one)")
    parser.add_argument("--repeat", type=int, default=7, help="fresh interpreters to time")
    parser.add_argument("--top", type=int, default=5, help="longest units to list")
    parser.add_argument("--venv", type=Path, default=None,
                        help="a virtual environment holding a bare install of the wheel: its "
                             "packages and size")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    start = time.perf_counter()
    figures = summary(units(args.src), args.top)
    root = args.src.resolve().parents[1]
    figures["reexports"] = reexports(args.src, (root / "tests", root / "benchmarks"))
    figures["import"] = import_cost(args.python, args.repeat)
    if args.venv is not None:
        figures["bare_install"] = install_size(args.venv)
    print(f"source: {args.src} ({figures['modules']} modules); CPU: {machine()['cpu']}")
    for package, n in figures["modules_per_package"].items():
        print(f"  {package:<22} {n:3d} modules")
    for label, key, limit in (("functions", "functions_over_limit", FUNCTION_LINES),
                              ("modules", "modules_over_limit", MODULE_LINES)):
        over = figures[key]
        print(f"{label} over {limit} lines: {len(over)}"
              + "".join(f"\n  {name:<48} {n:5d}" for name, n in over))
    for label, key in (("longest functions", "longest_functions"),
                       ("longest modules", "longest_modules")):
        print(label + ":" + "".join(f"\n  {name:<48} {n:5d}" for name, n in figures[key]))
    print(f"re-exported names: {len(figures['reexports'])}")
    if "bare_install" in figures:
        bare = figures["bare_install"]
        print(f"bare install: {bare['packages']} packages, site-packages "
              f"{bare['site_packages_mb']:.1f} MB; extras' packages there: "
              f"{', '.join(bare['extras_present']) or 'none'}")
    cost = figures["import"]
    print(f"import torch: {cost['torch_s']:.2f} s; then from linmem import LMN: "
          f"{cost['linmem_s']:.2f} s ({cost['linmem_modules_loaded']} linmem modules, "
          f"torch._dynamo {'loaded' if cost['dynamo_loaded'] else 'not loaded'}; "
          f"median of {cost['repeat']})")
    if args.json:
        figures["source"] = str(args.src)
        figures["source_commit"] = subprocess.run(
            ["git", "-C", str(args.src), "rev-parse", "HEAD"], capture_output=True,
            text=True).stdout.strip()
        figures.update(provenance(command_line(), git_commit(), None, None,
                                  time.perf_counter() - start))
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
