"""Rooms a person can hold in mind: no module of duotf over 700 lines, no function body over 80
(counted from its first statement, the docstring included, to its last line). Read with ``ast``."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MODULE_LINES = 700
MAX_BODY_LINES = 80


def _sources():
    for folder, _, files in os.walk(os.path.join(ROOT, "duotf")):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT), open(path, encoding="utf-8").read()


SOURCES = dict(_sources())


@pytest.mark.parametrize("path", sorted(SOURCES))
def test_no_module_over_700_lines(path):
    lines = len(SOURCES[path].splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path} has {lines} lines: split it by what it does"


@pytest.mark.parametrize("path", sorted(SOURCES))
def test_no_function_body_over_80_lines(path):
    long = []
    for node in ast.walk(ast.parse(SOURCES[path], path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.end_lineno - node.body[0].lineno + 1
            if body > MAX_BODY_LINES:
                long.append(f"{node.name} (line {node.lineno}): {body} lines")
    assert not long, f"{path}: function bodies over {MAX_BODY_LINES} lines: {long}"


def test_no_file_holds_a_merge_conflict_left_unresolved():
    # a cherry-pick's conflict once landed in docs/benchmarks.md, markers and both sides
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    left = []
    for path in tracked:
        if not path.endswith((".py", ".md", ".cfg", ".toml", ".yml", ".yaml", ".txt", ".sh")):
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            left += [f"{path}:{i}" for i, line in enumerate(f, 1)
                     if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line.rstrip("\n") == "<<<<<<<"]
    assert not left, f"merge conflict markers: {left}"
