"""The tree states the layers: no duotf module imports from a layer above its own (a rule on
package prefixes), and none touches a private name (``_x``) that another duotf module defines.

Read from the source with ``ast`` (nothing is imported), so the test is quick and cannot be
flaky. The private-name check is a heuristic: a module may use a private name it defines itself
(on any object of its own classes), and a name defined by no duotf module (``os._exit``,
``sys._getframe``) is not duotf's to judge.
"""

from __future__ import annotations

import ast
import fnmatch
import os
from typing import Dict, List, Set, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The layers, top first, as package prefixes: a module imports from its own layer or those below.
#: The tree states them (docs/internals/architecture.md draws it): a user package sits on the ML stages, those on
#: the driver, the driver on the backends, the backends on the node side, the node side on the
#: transport, and everything on io and the shared modules. A new module needs no entry here: its
#: package places it.
LAYERS: List[Tuple[str, List[str]]] = [
    ("the package's names", ["duotf", "duotf.__main__", "duotf.testing", "duotf.testing.*"]),
    ("user packages", ["duotf.spark", "duotf.spark.*", "duotf.dask", "duotf.dask.*"]),
    ("ML stages", ["duotf._ml", "duotf._ml.*"]),
    ("driver", ["duotf._driver", "duotf._driver.*"]),
    ("backends", ["duotf.backends", "duotf.backends.*"]),
    ("node side", ["duotf._node", "duotf._node.*", "duotf.context", "duotf.keras",
                   "duotf.averaging"]),
    ("transport", ["duotf._transport", "duotf._transport.*"]),
    ("io", ["duotf.io", "duotf.io.*"]),
    ("shared by every layer", ["duotf.errors", "duotf.spec", "duotf.reports", "duotf._version",
                               "duotf._verbosity", "duotf._deadline", "duotf._enum", "duotf._names"]),
]


def _modules() -> Dict[str, str]:
    """Every duotf module's dotted name -> its file."""
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "duotf")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(open(path, encoding="utf-8").read(), path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    for rank, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return rank
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py (and docs/internals/architecture.md): "
                         "place it there")


def _source(module: str, node: ast.ImportFrom) -> str:
    """The module an ``import from`` reads, absolute."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not MODULES[module].endswith("__init__.py"):
        parts = parts[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _imports(module: str):
    """``(line, imported duotf module, names)`` for every import in ``module``, lazy ones too."""
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.ImportFrom):
            source = _source(module, node)
            if source == "duotf" or source.startswith("duotf."):
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    yield node.lineno, (sub if sub in MODULES else source), alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "duotf" or alias.name.startswith("duotf."):
                    yield node.lineno, alias.name, None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(module: str) -> Set[str]:
    """The private names ``module`` defines: functions, classes, assignments (``x._y = ...``
    too) and parameters."""
    names: Set[str] = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            names.update(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if _private(n)}


DEFINED = {module: _defined(module) for module in MODULES}


def test_every_module_is_in_a_layer():
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_up_a_layer(module):
    rank = _layer(module)
    up = [f"line {line}: {target} ({LAYERS[_layer(target)][0]})"
          for line, target, _ in _imports(module) if _layer(target) < rank]
    assert not up, f"{module} ({LAYERS[rank][0]}) imports from a layer above its own: {up}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_touches_another_modules_private_names(module):
    own = DEFINED[module]
    others = {name: sorted(m for m, names in DEFINED.items() if name in names and m != module)
              for names in DEFINED.values() for name in names if name not in own}
    found = []
    for line, source, name in _imports(module):
        if name and _private(name) and source != module:
            found.append(f"line {line}: imports {name} from {source}")
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Attribute) and node.attr in others:
            found.append(f"line {node.lineno}: .{node.attr} (defined in {', '.join(others[node.attr])})")
        elif isinstance(node, ast.keyword) and node.arg in others:
            found.append(f"line {node.lineno}: {node.arg}= (defined in {', '.join(others[node.arg])})")
    assert not found, f"{module} touches private names of other duotf modules: {found}"
