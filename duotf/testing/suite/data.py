"""Plain data the feed tests share (the ``engine`` fixture turns it into an engine's collection)."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Dict, List

if TYPE_CHECKING:
    import numpy as np

# uneven, empty and more partitions than nodes: 45 rows in 5 partitions
SIZES = [10, 3, 0, 25, 7]
# Balanced over 2 workers, partitions are dealt in the order 0, 2, 4, 1, 3: the one row left
# over is the last of partition 3, row 37.
FED = [i for i in range(45) if i != 37]


def fed_every_epoch(ids, epochs) -> bool:
    """Every row but one (which one depends on how the engine keeps an empty partition), once an
    epoch."""
    seen = collections.Counter(ids)
    return len(seen) == 44 and set(seen) <= set(range(45)) and set(seen.values()) == {epochs}


def row_parts(sizes=SIZES) -> List[list]:
    """Rows ``(id / 10, id)``, ``sizes[p]`` of them in partition p."""
    parts, i = [], 0
    for size in sizes:
        parts.append([(float(i) / 10, i) for i in range(i, i + size)])
        i += size
    return parts


def frames(parts: List[list], columns: List[str]):
    """One pandas frame per partition, all of the first non-empty partition's dtypes."""
    import pandas as pd

    dtypes = pd.DataFrame(next(p for p in parts if p), columns=columns).dtypes
    return [pd.DataFrame(p or None, columns=columns).astype(dtypes) for p in parts]


def tensor_blocks(sizes: List[int], width: int) -> List[Dict[str, np.ndarray]]:
    """Partitions of rows ``x = id * 10 + [0, 1, ..., width)`` (float32) and ``id`` (int64)."""
    import numpy as np

    bounds = np.cumsum([0] + list(sizes))
    blocks = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        ids = np.arange(a, b, dtype=np.int64)
        blocks.append({"x": (ids[:, None] * 10 + np.arange(width)).astype(np.float32), "id": ids})
    return blocks


# -- scoring (tests/suite/test_scoring.py, tests/test_spark_scoring.py, tests/test_dask_scoring.py)
SCORING_ROWS, SCORING_WIDTH = 60, 4
SCORING_PARTS = 2  # few tasks at once: each new Python worker imports TensorFlow


def scoring_parts(x, ragged_row=None, parts=SCORING_PARTS) -> List[list]:
    """The rows ``(id, features)`` of ``x`` in ``parts`` partitions; row ``ragged_row`` holds
    one value instead of the width."""
    rows = [(i, [float(v) for v in x[i]]) for i in range(len(x))]
    if ragged_row is not None:
        rows[ragged_row] = (ragged_row, [1.0])
    size = len(rows) // parts
    return [rows[p * size:(p + 1) * size] for p in range(parts)]


def scoring_table(engine, x, ragged_row=None, parts=SCORING_PARTS):
    """``scoring_parts`` as the engine's DataFrame of ``id`` long, ``features`` array<float>."""
    return engine.table(scoring_parts(x, ragged_row, parts), {"id": "long", "features": "array<float>"})


def kept_frame_folders() -> set:
    """The folders of feed frames kept on this host (``duotf.spark.feed_cache``, and a Spark
    DataFrame converted once for several epochs): Spark's local dirs lie under the temp dir."""
    import glob
    import os
    import tempfile

    root = tempfile.gettempdir()
    return {path for depth in range(4)
            for path in glob.glob(os.path.join(root, *["*"] * depth, "duotf-feedcache-*"))
            if "pytest-of-" not in path}  # tests' own folders of that name


def epoch_rows(parts, workers: int, epoch: int, seed=None, window: int = 0) -> Dict[int, list]:
    """Each worker's rows of one epoch, in order: its planned ranges in partition order; with a
    ``seed`` (a shuffled feed) the plan of the epoch's order of partitions, and its rows
    permuted by windows of ``window`` rows."""
    from duotf._driver.planner import balance
    from duotf._transport import shuffle

    order = None if seed is None else shuffle.partition_order(len(parts), seed, epoch)
    plan, _, _ = balance([len(p) for p in parts], workers, True, order)
    rows: Dict[int, list] = {t: [] for t in range(workers)}
    for pid in sorted(plan):
        for target, a, b, _ in plan[pid]:
            rows[target].extend(parts[pid][a:b])
    if seed is not None:
        for t, got in rows.items():
            windows = [got[i:i + window] for i in range(0, len(got), window)]
            rows[t] = [w[j] for k, w in enumerate(windows)
                       for j in shuffle.permutation([seed, epoch, t], k, len(w))]
    return rows
