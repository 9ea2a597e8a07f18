"""The engines of the shared suite: :class:`Engine`, what a backend's test engine implements, and
:class:`LocalEngine`, duotf's in-process backend.

An engine starts its duotf Backend (:meth:`Engine.start`, which the session-scoped ``backend``
fixture of :mod:`duotf.testing.plugin` enters), turns plain data (lists of rows per partition,
pandas frames, numpy arrays) into the engine's own collection, and turns what
``Cluster.inference`` gives back into plain Python and pandas. Tests take the ``engine`` fixture
and never ask which engine it is: adding an engine to the suite is adding one class to the
engines a project declares. To implement one:

- subclass :class:`Engine` and implement its abstract methods: ``start`` (a context manager
  that yields the engine with its backend started, and stops it on exit), the plain data in
  (``rows``, ``frame``, ``table``, ``arrays``, ``row_sources``, ``constant_features``), the
  results out (``partitions``, ``to_pandas``) and ``feeding_processes``;
- set the class attributes that describe the engine (``executors``, ``gpu_setting``,
  ``feeds_beside_nodes``, ``converts_frames_once``, ``converts_in_jvm``);
- override the optional methods the engine has (``cli_args``, ``work_names``, scoring, ML
  stages): the tests that need them are kept to the engines that have them;
- an engine whose collection is "a list of partitions", like the in-process backend, subclasses
  :class:`LocalEngine` and overrides ``start`` (and what its processes differ in).

Nothing here imports pytest, psutil, pandas or numpy at module level: they are imported where
used.
"""

from __future__ import annotations

import abc
import contextlib
from typing import (TYPE_CHECKING, Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence,
                    Tuple, Union)

import duotf.backends

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import psutil
    import pytest

    from duotf._driver.cluster import Cluster
    from duotf.backends.base import Backend

__all__ = ["Engine", "LocalEngine", "PANDAS_DTYPES", "Processes", "TaskFailure", "pandas_frames"]

#: what ``Engine.feeding_processes`` returns: a list, or a callable giving the current list
Processes = Union[List["psutil.Process"], Callable[[], List["psutil.Process"]]]
"""What :meth:`Engine.feeding_processes` gives: the processes that run feeding tasks, or a
function that lists them when called (for engines whose workers come and go)."""


class Engine(abc.ABC):
    """A running engine of the suite, with its duotf Backend.

    ``handle`` is what a program passes to ``duotf.run`` for this engine (``None`` for the
    embedded backend, a ``distributed.Client``, a ``SparkSession``). A collection of the
    engine (what the data methods return, what ``Cluster.inference`` gives back) is typed
    ``Any``: an RDD, a DataFrame, a Bag, a list of partitions, as the engine holds data.

    To implement one, subclass it: ``start`` (a classmethod context manager that yields the
    engine, ``cls(backend, handle)``, and stops it on exit), every abstract method, the class
    attributes below where the engine differs, and the optional methods it has (the tests that
    need them are kept to the engines that have them). Then declare it to
    :mod:`duotf.testing.plugin` (the ``pytest_duotf_engines`` hook). An engine whose collection
    is a list of partitions subclasses :class:`LocalEngine` and overrides ``start`` only.
    """

    #: how many engine processes run node tasks (duotf gives each node one of its own while it can)
    executors = 1
    #: what the error names for a spec asking for GPUs, which no engine of the suite has
    gpu_setting = ""
    #: a process that runs feeding tasks may also run a node's task (a killed one takes a node along)
    feeds_beside_nodes = False
    #: a DataFrame fed several epochs is converted into feed frames once, in the first epoch
    converts_frames_once = False
    #: ... and that conversion runs in the engine's JVM (duotf's jar in a classic Spark session)
    converts_in_jvm = False
    #: runs only the tests that name its kind (``engines(...)`` or ``also_on(...)``), not every
    #: unmarked one: for an engine as costly to run as one across separate hosts
    opt_in = False
    #: the separate hosts its workers run on, or None where every worker shares one host: an
    #: object with ``hostnames`` (host i's), ``host_of(pid)`` (the host a process runs on),
    #: ``cut(i)`` / ``restore(i)`` (its link down and up), ``kill(i)`` (every process of it) and
    #: ``revive(i)`` (its engine worker started again); tests/hosts.py's ``Network`` is one
    hosts: Any = None

    def __init__(self, backend: Backend, handle: Any = None):
        self.backend = backend
        self.handle = handle

    @classmethod
    @abc.abstractmethod
    def start(cls, request: pytest.FixtureRequest) -> ContextManager["Engine"]:
        """A context manager: the engine started with room for 2 nodes and for the tasks
        feeding them, stopped on exit. ``request`` is the ``backend`` fixture's, for the session
        fixtures an engine needs."""

    # -- plain data in --------------------------------------------------------------------------
    @abc.abstractmethod
    def rows(self, parts: List[list]) -> Any:
        """A collection whose partition i holds exactly the tuples ``parts[i]`` (no partition at
        all for ``[]``)."""

    @abc.abstractmethod
    def frame(self, frames: List[pd.DataFrame]) -> Any:
        """A DataFrame whose partition i holds the rows of ``frames[i]`` (all of one schema)."""

    @abc.abstractmethod
    def table(self, parts: List[list], schema: Dict[str, str]) -> Any:
        """A DataFrame whose partition i holds the tuples ``parts[i]``, of the columns ``schema``
        (name: "long", "double", "string", "array<float>" or "array<string>"; lists for arrays);
        ``None`` is a
        null, as the engine holds one."""

    @abc.abstractmethod
    def arrays(self, blocks: List[Dict[str, np.ndarray]]) -> Tuple[object, Optional[dict]]:
        """Columns of numpy arrays (``blocks[i]`` is partition i; 2-D arrays are tensor
        columns) as the engine holds them best. Returns ``(data, input_mapping)``: the mapping
        to give ``get_data_feed`` so that a node sees the blocks' own column names."""

    @abc.abstractmethod
    def row_sources(self, sources: List[Callable[[], object]]) -> Any:
        """A collection whose partition i holds the rows that ``sources[i]()`` yields: a
        picklable callable, with ``len``, called inside the engine's tasks that read the
        partition (its count and its feed), never on the driver, so that what it raises is a
        failure of the engine's own task."""

    @abc.abstractmethod
    def constant_features(self, rows: int, parts: int, width: int, chunk: int, ids: bool = False) -> Any:
        """``rows`` rows of ``"0"``: ``width`` float32 values 0.5, and ``"1"``: the row's id
        modulo 10 (with ``ids``, the id itself), made on the engine (they never sit in the
        driver's memory): ``parts`` partitions, or blocks of ``chunk`` rows where the engine
        holds arrays in blocks."""

    # -- results out ----------------------------------------------------------------------------
    @abc.abstractmethod
    def partitions(self, out: Any) -> List[list]:
        """The rows of a collection that ``Cluster.inference`` returned, partition by partition."""

    @abc.abstractmethod
    def to_pandas(self, out: Any) -> pd.DataFrame:
        """A DataFrame that ``Cluster.inference`` returned, in order, with a fresh index."""

    # -- the command line -----------------------------------------------------------------------
    def cli_args(self) -> List[str]:
        """The options that point ``python -m duotf`` (another process) at this engine."""
        raise NotImplementedError(f"{type(self).__name__}: no command line options")

    # -- the engine's own UI -----------------------------------------------------------------------
    def work_names(self, job_id: str) -> List[str]:
        """The names the engine's own UI shows for duotf job ``job_id``'s work (none: the
        engine has no UI)."""
        return []

    def expected_work_names(self, job_id: str, nodes: Sequence[str], epochs: int,
                            by_reference: int = 0) -> List[str]:
        """What each of those names starts with, for a job of ``nodes`` fed ``epochs`` times,
        the last ``by_reference`` of them without engine tasks (the report's
        ``epochs_fed_by_reference``)."""
        return []

    # -- processes ------------------------------------------------------------------------------
    @abc.abstractmethod
    def feeding_processes(self) -> Processes:
        """The processes the engine's feeding tasks run in (a list, or a callable giving the
        current list where they come and go)."""

    def mend(self, wait: float = 60) -> Optional[str]:
        """Bring the engine back to its full size where a test killed part of it and the engine
        did not replace that part itself within ``wait`` seconds (default: nothing to do).
        Called before every test, so that one engine's failure to replace a process fails one
        test, not every later one. Returns what was mended, for a warning, or None."""
        return None

    def away_from_nodes(self, data: Any, cluster: Cluster) -> Any:
        """``data`` placed where the engine runs no node of ``cluster`` while it can, so that its
        feeding tasks run in processes that host no node (default: as it is: an engine whose
        feeding tasks never share a node's process)."""
        return data

    # -- scoring a DataFrame with a saved model (engines with a DataFrame: Dask, Spark) ---------
    def score(self, df: Any, model: Any, **kwargs: Any) -> Any:
        """``df`` scored by ``model`` with the engine's DataFrame scoring function
        (``duotf.spark.predict`` / ``duotf.dask.predict``: ``columns=``, ``output=``,
        ``batch_size=``), lazily; what it refuses on the driver is raised here."""
        raise NotImplementedError(f"{type(self).__name__} scores no DataFrame")

    def score_every_way(self, df: Any, model: Any, output: str, return_type: str = "double",
                        batch_size: int = 1024) -> Dict[str, object]:
        """Each way the engine offers to score ``df``'s column ``"features"`` into the column
        ``output``, by name: the lazy scored collection, every column of ``df`` kept.
        ``return_type`` is the Spark type of ``output`` (Dask takes the model's)."""
        raise NotImplementedError(f"{type(self).__name__} scores no DataFrame")

    def scoring_stats(self) -> Dict[int, dict]:
        """``duotf._ml.scoring.cache_stats()`` of the processes that run the engine's tasks, by pid."""
        raise NotImplementedError(f"{type(self).__name__} scores no DataFrame")

    # -- ML stages: TFEstimator and TFModel (engines with a DataFrame: Dask, Spark) ------------
    def ml_stages(self) -> Tuple[type, type, dict]:
        """``(TFEstimator, TFModel, kwargs)``: the engine's ML stages, and the keyword arguments
        a TFEstimator takes on this engine beside its parameters."""
        raise NotImplementedError(f"{type(self).__name__} has no ML stages")

    def ml_name(self, name: str) -> str:
        """A parameter or attribute of the ML stages, given in Spark ML's camelCase, as the
        engine's stages spell it (Dask: snake_case, as scikit-learn and dask-ml)."""
        return name

    def model_at(self, path: str, **params: Any) -> Any:
        """A TFModel of the saved model at ``path``, with ``params`` (spelled as the engine's
        stages spell them: :meth:`ml_name`)."""
        raise NotImplementedError(f"{type(self).__name__} has no ML stages")

    def apply_model(self, model: Any, df: Any) -> Any:
        """``df`` scored by the TFModel ``model``, lazily (Spark: transform; Dask: predict)."""
        raise NotImplementedError(f"{type(self).__name__} has no ML stages")

    def model_path(self, model: Any) -> str:
        """Where the TFModel's saved Keras model lies."""
        raise NotImplementedError(f"{type(self).__name__} has no ML stages")

    def save_and_load(self, model: Any, folder: str) -> Any:
        """The TFModel ``model`` saved to ``folder`` the engine's way, and loaded back."""
        raise NotImplementedError(f"{type(self).__name__} has no ML stages")

    @contextlib.contextmanager
    def task_failure(self) -> Iterator[TaskFailure]:
        """Expect the block to fail in an engine task: yields a ``TaskFailure`` whose ``text``
        (``"module.Type: message"`` as the task raised it, engine's context around it) is set
        when the block raised; the test fails if it did not."""
        failure = TaskFailure()
        try:
            yield failure
        except Exception as exc:  # noqa: BLE001 - the engine's own error, turned into text
            failure.text = self._task_error_text(exc)
        if failure.text is None:
            raise AssertionError("the engine task did not fail")

    def _task_error_text(self, exc: BaseException) -> str:
        """The text of an error a task raised, as the driver gets it."""
        return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"


class TaskFailure:
    """What ``Engine.task_failure`` saw: ``text``, the error an engine task raised."""

    text: Optional[str] = None


#: how pandas holds each kind of column of ``Engine.table``, nulls included
PANDAS_DTYPES = {"long": "Int64", "double": "float64", "string": "object", "array<float>": "object",
                  "array<string>": "object", "boolean": "bool"}


def pandas_frames(parts: List[list], schema: Dict[str, str]) -> list:
    """The pandas frames of ``Engine.table``'s ``parts``: one a partition, nulls kept."""
    import pandas as pd

    dtypes = {name: PANDAS_DTYPES[kind] for name, kind in schema.items()}
    frames = []
    for part in parts:
        frame = pd.DataFrame({name: pd.Series([row[i] for row in part], dtype=object)
                              for i, name in enumerate(schema)})
        frames.append(frame.astype(dtypes))
    return frames


class LocalEngine(Engine):
    """The in-process backend: a collection is a list of partitions."""

    gpu_setting = "LocalBackend(gpus=N)"

    @classmethod
    @contextlib.contextmanager
    def start(cls, request: pytest.FixtureRequest) -> Iterator[LocalEngine]:
        yield cls(duotf.backends.LocalBackend(slots=4))

    def rows(self, parts: List[list]) -> List[list]:
        return [list(p) for p in parts]

    def frame(self, frames: List[pd.DataFrame]) -> List[pd.DataFrame]:
        return list(frames)

    def table(self, parts: List[list], schema: Dict[str, str]) -> List[pd.DataFrame]:
        return pandas_frames(parts, schema)

    def arrays(self, blocks: List[Dict[str, np.ndarray]]) -> Tuple[object, Optional[dict]]:
        return [dict(b) for b in blocks], None

    def row_sources(self, sources: List[Callable[[], object]]) -> List[Callable[[], object]]:
        return list(sources)  # a callable partition: called by the count and by the feed

    def constant_features(self, rows: int, parts: int, width: int, chunk: int,
                          ids: bool = False) -> List[Callable[[], Iterator[Dict[str, np.ndarray]]]]:
        import numpy as np

        bounds = np.linspace(0, rows, parts + 1).astype(int)

        def part(start, stop):
            def chunks():
                for a in range(start, stop, chunk):
                    row = np.arange(a, min(a + chunk, stop))
                    yield {"0": np.full((len(row), width), 0.5, dtype=np.float32),
                           "1": row if ids else row % 10}
            return chunks

        return [part(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def partitions(self, out: Any) -> List[list]:
        return [list(p) for p in out]

    def to_pandas(self, out: Any) -> pd.DataFrame:
        import pandas as pd

        return pd.concat(out, ignore_index=True)

    def feeding_processes(self) -> Processes:
        import psutil

        return [psutil.Process()]  # the feeding threads run in this process

    def cli_args(self) -> List[str]:
        return ["--backend", "local"]
