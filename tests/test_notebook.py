"""The notebook guide, docs/guides/notebook.ipynb, run cell by cell by a real Jupyter kernel.

nbclient runs it in an IPython kernel of this interpreter (ipykernel), as a notebook user's
Jupyter does, and the test reads the cells' outputs as the notebook shows them: consecutive
stream outputs of one name run together, and a carriage return redraws its line (tqdm's text
bar). It checks what the user sees: a bar per epoch of ``cluster.train`` (tqdm's text bar on
stderr, or its widget where ipywidgets is installed), each node's own lines tagged
``[worker:N]`` in the cell that was running, nothing else on the way (no warning, no
TensorFlow noise), the metrics, and the trained weights in the last cell.

The notebook is stored without outputs; this is what runs it in CI.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import time
from typing import List, Tuple

import nbformat
from ipykernel.kernelspec import write_kernel_spec
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "docs", "guides", "notebook.ipynb")

#: the only lines a node writes in the training cell (``[worker:N]`` is duotf's tag)
NODE_LINES = [
    r"\[worker:([01])\] worker:\1 of 2 workers, TensorFlow \S+",
    r"\[worker:0\] Epoch [123]/3",
    r"\[worker:0\] \d+/\d+ - .*loss: \d+\.\d+",
]
WIDGET = "application/vnd.jupyter.widget-view+json"


def shown(outputs) -> List[Tuple[str, str]]:
    """``outputs`` as a notebook shows them: ``(kind, text)``, with kind a stream's name or an
    output's type (its ``text/plain`` as text), consecutive streams of one name as one, and
    each line's carriage returns applied (what follows the last one stays)."""
    blocks: List[Tuple[str, str]] = []
    for out in outputs:
        if out["output_type"] == "stream":
            if blocks and blocks[-1][0] == out["name"]:
                blocks[-1] = (out["name"], blocks[-1][1] + out["text"])
            else:
                blocks.append((out["name"], out["text"]))
        else:
            blocks.append((out["output_type"], out.get("data", {}).get("text/plain", "")))
    return [(kind, "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n")))
            for kind, text in blocks]


def lines(blocks, kind: str) -> List[str]:
    return [line for k, text in blocks if k == kind for line in text.splitlines() if line]


def execute(path: str, workdir, monkeypatch) -> nbformat.NotebookNode:
    """Run the notebook at ``path`` in a kernel of this interpreter, in ``workdir``."""
    nb = nbformat.read(path, as_version=4)
    # The kernel "python3" is this interpreter, whatever kernelspecs the machine has:
    # JUPYTER_PATH comes before the user's and the system's folders.
    write_kernel_spec(workdir / "jupyter" / "kernels" / "python3")  # argv: sys.executable
    monkeypatch.setenv("JUPYTER_PATH", str(workdir / "jupyter"))
    NotebookClient(nb, kernel_name="python3", timeout=120, startup_timeout=60,
                   resources={"metadata": {"path": str(workdir)}}).execute()
    return nb


def test_the_notebook_guide_shows_bars_node_output_and_the_result(tmp_path, monkeypatch):
    stored = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(stored)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in stored.cells if c.cell_type == "code"), "store the notebook cleared"

    started = time.monotonic()
    nb = execute(NOTEBOOK, tmp_path, monkeypatch)
    took = time.monotonic() - started
    code = {c.source.splitlines()[0]: c for c in nb.cells if c.cell_type == "code"}
    cells = {source: shown(cell.outputs) for source, cell in code.items()}
    train = cells["cluster.train(parts, epochs=3)"]

    # Nothing but the bars on any cell's stderr: no warning (tqdm's "IProgress not found"
    # without ipywidgets), no traceback.
    for source, blocks in cells.items():
        for line in lines(blocks, "stderr"):
            assert line.startswith("feed epoch "), f"{source!r} wrote to stderr: {line!r}"

    if importlib.util.find_spec("ipywidgets") is None:
        # tqdm's text bar, one per epoch, each as it ended; the last shows the last loss
        # reported, which cluster.wait() brought in.
        bars = lines(train, "stderr")
        assert len(bars) >= 3, train
        ends = [line for line in bars if "| 2000/2000 [fed in " in line]
        for epoch in (1, 2, 3):
            assert any(line.startswith(f"feed epoch {epoch}/3 (rows queued): 100%|")
                       for line in ends), bars
        assert re.search(r"reported: loss=0\.0\d+ \(step 2\)\]$", bars[-1]), bars[-1]
    else:
        # tqdm's widget, one per epoch
        widgets = [out for out in code["cluster.train(parts, epochs=3)"].outputs
                   if WIDGET in out.get("data", {})]
        assert len(widgets) == 3, train

    # Each node's own lines, tagged, in the cell that ran while they printed, and nothing else.
    node_lines = lines(train, "stdout")
    for line in node_lines:
        assert any(re.fullmatch(p, line) for p in NODE_LINES), f"not a node's line: {line!r}"
    for expected in ("[worker:0] worker:0 of 2 workers", "[worker:1] worker:1 of 2 workers",
                     "[worker:0] Epoch 1/3", "[worker:0] Epoch 3/3"):
        assert any(line.startswith(expected) for line in node_lines), (expected, node_lines)
    assert sum("loss: " in line for line in node_lines) == 3, node_lines

    # The metrics: one column a node, one row a step.
    (kind, table), = cells['cluster.metrics.pivot(index="step", columns="node", values="loss")']
    assert kind == "execute_result" and "worker:0" in table and "worker:1" in table, table
    assert [row.split()[0] for row in table.splitlines()[2:]] == ["0", "1", "2"], table

    # A node's log, kept; and the result: the weights 1 to 6 learned.
    log = lines(cells['print(cluster.logs("worker:1"), end="")'], "stdout")
    assert log[0].startswith("worker:1 of 2 workers"), log
    (_, printed), (kind, weights) = cells["cluster.shutdown()"]
    assert re.fullmatch(r"final loss 0\.0\d+\n", printed), printed
    assert kind == "execute_result"
    assert [round(w) for w in ast.literal_eval(weights)] == [1, 2, 3, 4, 5, 6], weights
    print(f"notebook executed in {took:.1f} s")
