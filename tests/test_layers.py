"""The tree states the layers, and the tools hold it so.

- Imports: ``.importlinter``'s contracts, checked by import-linter (``lint-imports``) on every
  import, lazy ones (inside functions) included: no module imports from a layer above its own,
  and no package's modules import each other in a circle.
- Every module is placed: each child of ``duotf`` is named in the layers contract (import-linter
  leaves a module it is not told of unchecked).
- Private names: none of a module's private names (``_x``) is touched by another duotf module.
  Read from the source with ``ast``, a heuristic: a module may use a private name it defines
  itself (on any object of its own classes), and a name defined by no duotf module
  (``os._exit``, ``sys._getframe``) is not duotf's to judge.
"""

from __future__ import annotations

import ast
import configparser
import os
import shutil
import subprocess
import sys
from typing import Dict, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACTS = os.path.join(ROOT, ".importlinter")


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


def _lint_imports():
    found = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is missing: pip install -e '.[dev]' (import-linter)")
    return found


def test_the_import_contracts_hold():
    done = subprocess.run([_lint_imports(), "--config", CONTRACTS, "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-2000:]


def test_every_child_of_duotf_is_in_a_layer():
    config = configparser.ConfigParser()
    config.read(CONTRACTS)
    layers = config["importlinter:contract:layers"]["layers"]
    placed = {name.strip() for line in layers.split("\n") for name in line.replace("|", ":").split(":")
              if name.strip()}
    children = {module.split(".")[1] for module in MODULES if module.count(".") >= 1}
    assert not children - placed, (f"duotf's {sorted(children - placed)} are in no layer of "
                                   ".importlinter (nor docs/internals/architecture.md): place them")


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
