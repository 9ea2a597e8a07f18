"""A script file as every node's main: ``duotf run train.py -- --epochs 3``, as ``torchrun``
runs one.

The driver reads the file and ships its source (the executors need only the packages it
imports, not the file). On each node the script runs in the node process, in its working
directory, with ``TF_CONFIG`` set:

* a script that defines ``main(args, ctx)`` at its top level is executed as a module named
  ``__duotf_script__`` (its ``if __name__ == "__main__":`` block does not run), then
  ``main(args, ctx)`` is called with the arguments after ``--``; its value is the node's;
* any other script runs top to bottom as ``__main__`` with ``sys.argv`` = ``[path, *args]``
  (the path as typed, as ``python path`` gives it; ``__file__`` is absolute):
  it reads ``TF_CONFIG`` (``MultiWorkerMirroredStrategy`` does) but not the feed, which needs
  ``ctx``; the node's value is None. ``sys.exit(0)`` ends it as returning does; another status
  fails the node.
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Any, Dict, List, Optional

__all__ = ["ScriptMain", "defines_main"]


def defines_main(source: str, path: str = "<script>") -> bool:
    """Whether ``source`` defines ``main`` at its top level taking ``(args, ctx)`` (two
    positional parameters, or ``*args``). A syntax error is raised as :class:`SyntaxError`."""
    for node in ast.parse(source, path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main":
            positional = node.args.posonlyargs + node.args.args
            return len(positional) >= 2 or node.args.vararg is not None
    return False


class ScriptMain:
    """The main of ``duotf run SCRIPT.py``: a script's source, run on each node (see the
    module docstring). Picklable by reference: its class is duotf's."""

    def __init__(self, path: str, source: str, has_main: bool, argv0: Optional[str] = None):
        self.path = path  # absolute: the script's __file__, as Python sets it
        self.source = source
        self.has_main = has_main
        self.argv0 = argv0 or path  # sys.argv[0]: the path as the user typed it

    def __repr__(self) -> str:
        return f"ScriptMain({self.path!r}{', main(args, ctx)' if self.has_main else ''})"

    def __call__(self, args: Optional[List[str]], ctx) -> Any:
        from duotf._node.job import install_sources

        install_sources({self.path: self.source})  # inspect and AutoGraph read it from there
        code = compile(self.source, self.path, "exec")
        argv = [str(a) for a in (args or [])]
        if self.has_main:
            namespace: Dict[str, Any] = {"__name__": "__duotf_script__", "__file__": self.path}
            exec(code, namespace)  # noqa: S102 - the user's own script, as python would run it
            return namespace["main"](argv, ctx)
        namespace = {"__name__": "__main__", "__file__": self.path}
        saved = sys.argv
        sys.argv = [self.argv0, *argv]
        try:
            exec(code, namespace)  # noqa: S102
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise RuntimeError(f"{os.path.basename(self.path)} exited with status {exc.code}") from None
        finally:
            sys.argv = saved
        return None
