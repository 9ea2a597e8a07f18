"""Quiet by default, useful when asked (issue 13, point 7): the engines' known notices, the
nodes' TensorFlow C++ INFO notes and duotf's own log records, off and on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import duotf
import duotf._verbosity as verbosity

PANDAS_NOTICE = ("PySpark does not yet fully support pandas >= 3.0.0. Some features may not work "
                 "correctly. It is recommended to use pandas < 3.0.0 for now.")


def _filters_for(text: str) -> int:
    return sum(1 for entry in warnings.filters
               if entry[0] == "ignore" and entry[1] is not None and entry[1].match(text))


def test_the_pandas_notice_is_filtered_once_and_shown_when_verbose():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        verbosity.quiet_known_notices()
        verbosity.quiet_known_notices()
        assert _filters_for(PANDAS_NOTICE) == 1
        warnings.warn(PANDAS_NOTICE, FutureWarning)
        warnings.warn("another FutureWarning", FutureWarning)  # only the known notice goes
        assert [str(w.message) for w in seen] == ["another FutureWarning"]
        try:
            duotf.set_verbose(True)
            assert _filters_for(PANDAS_NOTICE) == 0
            warnings.warn(PANDAS_NOTICE, FutureWarning)
            assert [str(w.message) for w in seen][-1] == PANDAS_NOTICE
        finally:
            duotf.set_verbose(False)
        assert _filters_for(PANDAS_NOTICE) == 1 and not verbosity.is_verbose()


SCRIPT = textwrap.dedent("""
    import os
    import duotf

    def main(args, ctx):
        print("hello from the node")
        return os.environ.get("TF_CPP_MIN_LOG_LEVEL")

    if __name__ == "__main__":
        with duotf.run(main, None, "local", duotf.ClusterSpec(workers=1), verbose={verbose}) as c:
            print("RESULT", c.wait(timeout=60))
""")


def _script(tmp_path, verbose: bool):
    path = tmp_path / f"verbose_{verbose}.py"
    path.write_text(SCRIPT.format(verbose=verbose))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(duotf.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)


def test_a_script_is_quiet_by_default_and_shows_everything_when_verbose(tmp_path):
    """A plain script (no logging configured): by default nothing of duotf's on stderr and the
    nodes' TF INFO notes hidden; ``verbose=True``: the lifecycle and the node's lines on stderr,
    and the nodes told to show TF's INFO notes."""
    quiet = _script(tmp_path, False)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.splitlines() == ["RESULT ['1']"]
    assert "duotf" not in quiet.stderr and "hello from the node" not in quiet.stderr

    loud = _script(tmp_path, True)
    assert loud.returncode == 0, loud.stderr
    assert loud.stdout.splitlines() == ["RESULT ['0']"]
    lines = loud.stderr.splitlines()
    assert any(line.startswith("duotf: starting 1 nodes on local") for line in lines), lines
    assert "[worker:0] hello from the node" in lines, lines
    assert any(line.startswith("duotf: cluster") and "shut down" in line for line in lines), lines
