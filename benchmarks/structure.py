"""The package's structure, as a newcomer meets it: how many modules each package holds, the
longest functions and modules (against the limits that ``tests/test_architecture.py`` sets), and
what ``from linmem import LMN`` costs beyond ``import torch``.

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
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    start = time.perf_counter()
    figures = summary(units(args.src), args.top)
    figures["import"] = import_cost(args.python, args.repeat)
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
